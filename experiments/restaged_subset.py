"""Where the image term of the restaged protocol points (issue 40): on val, for each restaging strength of the
calibration grid, the share of the image-only ranking's top 4 (the reference left out) that lies in the query's
subset, and how often the target is the image's first pick inside its subset (chance: 1 in 5).

    python experiments/restaged_subset.py --run runs/vit-seeds/seed-0 [--share 0.9] [--strengths 0,0.5,1]

Reads the features that experiments/restaged_calibration.py extracted (RUN/restaged-calibration/s-S-p-P/).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from foco.features import FeatureCache
from foco.utils.io import read_jsonl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/vit-seeds/seed-0")
    ap.add_argument("--share", type=float, default=0.9)
    ap.add_argument("--strengths", default="0,0.5,1")
    a = ap.parse_args()
    run = Path(a.run)
    queries = read_jsonl(run / "world" / "benchmarks" / "val" / "single" / "queries.jsonl")
    for s in (float(x) for x in a.strengths.split(",")):
        fc = FeatureCache(run / "restaged-calibration" / f"s-{s:g}-p-{a.share:g}" / "val-restaged")
        ids, feats = fc.stored_images()
        g = feats.global_  # (N, D), normalised
        pos = {i: k for k, i in enumerate(ids)}
        in_subset = first = 0.0
        for q in queries:
            r = pos[q["reference"]]
            sims = g @ g[r]  # (N,)
            sims[r] = float("-inf")
            top = sims.topk(4).indices.tolist()
            subset = {pos[x] for x in q["subset"]} - {r}
            in_subset += sum(t in subset for t in top) / 4
            first += max(subset, key=lambda k: float(sims[k])) == pos[q["target"]]
        n = len(queries)
        print(f"strength {s:g}: image top-4 inside the subset {in_subset / n:.3f}; target first within its "
              f"subset {first / n:.3f} ({n} queries, {len(ids)} candidates)")


if __name__ == "__main__":
    main()
