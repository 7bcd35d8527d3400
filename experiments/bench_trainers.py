"""Training speed of two checkouts side by side: FoCo (stage 1 + stage 2) on the first N training pairs of a
quickstart run, each source tree in its own process, alternating, median of R repeats.

    git worktree add /tmp/foco-old <commit>
    python experiments/bench_trainers.py --run runs/quickstart --src /tmp/foco-old/src src --pairs 2048 --repeats 3

Used to check that a restructure leaves training speed alone (docs/history.md, issue 11). Each process imports the
trainer from wherever that tree keeps it (`foco.train.foco` now, `foco.train` before the training loop was shared).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import dataclasses, json, sys, tempfile, time
run, n = sys.argv[1], int(sys.argv[2])
try:
    from foco.train.foco import FoCoTrainConfig, train_foco
    from foco.train.data import build_pair_table
    from foco.world.decompositions import world_decompositions
except ImportError:  # the layout before the shared training loop
    from foco.train import FoCoTrainConfig, train_foco
    from foco.data import build_pair_table
    from foco.decompose.world import world_decompositions
from foco.model import FoCoConfig
decs = world_decompositions(f"{run}/world", "train", f"{run}/decompositions.sqlite", "oracle")
table = build_pair_table(f"{run}/features/train", decs)
table = dataclasses.replace(table, image_global=table.image_global[:n], patches=table.patches[:n],
                            local_idx=table.local_idx[:n], context_idx=table.context_idx[:n])  # the first n pairs
cfg = FoCoTrainConfig(stage1_epochs=1, stage2_epochs=1, batch_size=128, lr_stage1=1e-3, lr_aggr=3e-4,
                      lr_comp=3e-4, max_negatives=31, model=FoCoConfig(learn_bias=True))
with tempfile.TemporaryDirectory() as out:
    t0 = time.perf_counter()
    model = train_foco(table, out, cfg)
    seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "checksum": float(sum(p.double().sum() for p in model.parameters()))}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/quickstart")
    ap.add_argument("--src", nargs="+", required=True, help="source folders (each holding foco/) to compare")
    ap.add_argument("--pairs", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    times: dict[str, list[float]] = {s: [] for s in a.src}
    sums: dict[str, set[float]] = {s: set() for s in a.src}
    for _ in range(a.repeats):
        for src in a.src:
            env = {**os.environ, "PYTHONPATH": str(Path(src).resolve())}
            out = subprocess.run([sys.executable, "-c", CHILD, a.run, str(a.pairs)], env=env, check=True,
                                 capture_output=True, text=True).stdout
            res = json.loads(out.strip().splitlines()[-1])
            times[src].append(res["seconds"])
            sums[src].add(res["checksum"])
    med = {s: statistics.median(t) for s, t in times.items()}
    first = a.src[0]
    print(json.dumps({"pairs": a.pairs, "repeats": a.repeats, "median_s": med, "all_s": times,
                      "ratio_to_first": {s: med[s] / med[first] for s in a.src},
                      "same_weights": len({c for cs in sums.values() for c in cs}) == 1}, indent=2))


if __name__ == "__main__":
    main()
