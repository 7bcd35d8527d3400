"""FoCo's patches stored (`foco index build --with-patches`: a memory-mapped float16 array) or computed at query
time (the reference image is encoded again): bytes per image on disk and the time of a composed query, both ways,
on the same folder and checkpoint, in one run.

    python experiments/bench_query_patches.py --images WORLD/images/test-single --checkpoint runs/quickstart/foco \
        [--backbone world:pretrained] [--queries 200] [--out /tmp/foco-patches]

Both indexes are built with the same backbone; each query is `SearchEngine.search` with method foco on an
indexed reference (the case the stored patches serve), one at a time, after a warm-up; reported as the median and
p90 over the queries. The two must return the same results (checked).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

TEXTS = ["make the circle blue", "add a star", "remove the square", "make the heart bigger"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--backbone", default="world:pretrained")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--out", default="/tmp/foco-patches")
    a = ap.parse_args()
    from foco.search.build import IndexConfig, build_index
    from foco.search.engine import Query, SearchEngine
    out, report = Path(a.out), {}
    answers = {}
    for with_patches in (True, False):
        name = "stored" if with_patches else "computed"
        folder = out / name
        t0 = time.time()
        build_index(IndexConfig(images=a.images, backbone=a.backbone, with_patches=with_patches), folder)
        build_s = time.time() - t0
        engine = SearchEngine.open(folder, checkpoint=a.checkpoint)
        n = engine.count()
        sizes = engine.store.feature_bytes()
        rng = random.Random(0)
        qs = [Query(rng.choice(TEXTS), rng.randint(1, n), "foco", k=10) for _ in range(a.queries)]
        for q in qs[:5]:
            engine.search(q)
        times, got = [], []
        for q in qs:
            t1 = time.perf_counter()
            got.append([h.id for h in engine.search(q).hits])
            times.append(time.perf_counter() - t1)
        times.sort()
        answers[name] = got
        report[name] = {"images": n, "build_s": round(build_s, 1), "vector_bytes_per_image": sizes["vectors"] // n,
                        "patch_bytes_per_image": sizes["patches"] // n,
                        "query_ms_median": round(1000 * statistics.median(times), 2),
                        "query_ms_p90": round(1000 * times[int(0.9 * len(times))], 2)}
    report["same_results"] = answers["stored"] == answers["computed"]
    print(json.dumps(report, indent=2))
    (out / "patches.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
