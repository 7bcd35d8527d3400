"""How much the quickstart's headline numbers move with the training seed: `foco quickstart` with each seed, then
mean and sample standard deviation of every method's metrics.

    python experiments/quickstart_seeds.py --seeds 0,1,2 --out runs/seeds [--size default] [--precision auto] \
        [--backbone vit]

Seed s runs in OUT/seed-s. The world, the backbone, the decompositions, the features and the edit triplets do not
depend on the training seed, so the later seeds link to the first seed's (symbolic links: feature caches key image
files by their resolved path, so a copied world would not match its copied caches). A seed changes only FoCo's and
foco-edits' initialisation, batch order and negatives. Resumable: a finished seed is not rerun. OUT/seed-FIRST may
itself be a link to an existing quickstart folder (`make demo`'s runs/quickstart is seed 0). Writes OUT/seeds.json
and OUT/seeds.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from foco.quickstart import run_quickstart

SHARED = ("world", "features", "decompositions.sqlite", "edits.sqlite", "backbone.json")
HEADLINE = ("R@1", "R@5", "Rs@1", "mAP@10")


def _link_shared(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for name in SHARED:
        if (src / name).exists() and not (dst / name).exists():
            (dst / name).symlink_to((src / name).resolve())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds")
    ap.add_argument("--out", required=True, help="output folder (one quickstart folder per seed)")
    ap.add_argument("--size", default="default", choices=["tiny", "default"], help="world size")
    ap.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"], help="as foco quickstart's")
    ap.add_argument("--backbone", default="vit", choices=["vit", "cnn"], help="as foco quickstart's")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    out = Path(a.out)
    runs, wall = {}, {}
    for i, seed in enumerate(seeds):
        folder = out / f"seed-{seed}"
        if i:
            _link_shared(out / f"seed-{seeds[0]}", folder)
        t0 = time.time()
        runs[seed] = run_quickstart(folder, a.size, seed=seed, precision=a.precision, backbone=a.backbone)
        wall[seed] = round(time.time() - t0, 1)
        print(f"seed {seed}: {wall[seed]} s", flush=True)
    methods = list(runs[seeds[0]]["methods"])
    summary = {}
    for m in methods:
        summary[m] = {}
        for k in runs[seeds[0]]["methods"][m]:
            vals = [runs[s]["methods"][m][k] for s in seeds]
            summary[m][k] = {"mean": statistics.fmean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                             "values": vals}
    report = {"seeds": seeds, "size": a.size, "backbone": a.backbone, "precision": runs[seeds[0]]["precision"], "wall_s": wall,
              "metrics": summary, "timings_s": {s: runs[s]["timings_s"] for s in seeds}}
    (out / "seeds.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["| method | " + " | ".join(f"{k} mean ± sd" for k in HEADLINE) + " |",
             "|---|" + "---|" * len(HEADLINE)]
    for m in methods:
        lines.append(f"| {m} | " + " | ".join(f"{summary[m][k]['mean']:.1f} ± {summary[m][k]['sd']:.1f}"
                                               for k in HEADLINE) + " |")
    table = "\n".join(lines)
    (out / "seeds.md").write_text(f"Seeds {seeds}, world {a.size}, precision {report['precision']}\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
