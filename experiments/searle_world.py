"""SEARLE-XL on the world's test protocols: OTI once, phi distilled with 3 seeds (issue 57, item 5's SEARLE rows).

    OMP_NUM_THREADS=1 python experiments/searle_world.py --run runs/quickstart --images 512 --seeds 0,1,2

The calibration, fixed before any SEARLE run saw a protocol (docs/history.md, "Issue 57: SEARLE's calibration"):
* OTI (`foco searle oti`) with the reference's settings (350 steps of AdamW at 2e-2 per batch of 32, decay 0.01,
  top 15 concepts, EMA 0.99, lambdas 1 and 0.5) on `--images` images of the world's training cache, a seeded
  sample: the reference inverts all 100,000 of ImageNet's test split; here the CPU sets the count (about 5-10 s of
  one core per image);
* phi (`foco searle train`) with the reference's settings (100 epochs, batch 256, AdamW 1e-4, decay 0.01, constant,
  tau 0.25, lambdas 1 and 0.75, top 150 concepts, dropout 0.5), seeds 0-2, on those images' EMA tokens;
* the query "a photo of * that {modification}" (validate.py's), on `world:vit`'s test features; nothing is chosen
  on val.
Writes RUN/searle/{oti/, phi-sS/, test-sS.json, results-sSEEDS.json} and prints R@1 and Rs@1 per protocol (mean +-
sample sd). Reuses what an earlier run left (each stage resumes).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from slerptat_world import _run  # one runner of foco commands for the issue-57 experiments

PROTOCOLS = ("single", "described", "restaged")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a quickstart run (its world and train features)")
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--seeds", default="0,1,2")
    a = ap.parse_args()
    root = a.run / "searle"
    feats = a.run / "features" / "train"
    seeds = [int(s) for s in a.seeds.split(",")]
    times = {}
    if not (root / "oti" / "oti.json").is_file():
        times["oti_s"] = _run(["searle", "oti", "--features", feats, "--out", root / "oti", "--images", a.images])
    results = {}
    for s in seeds:
        phi, test = root / f"phi-s{s}", root / f"test-s{s}.json"
        if not (phi / "searle.json").is_file():
            times[f"phi_s{s}_s"] = _run(["searle", "train", "--features", feats, "--oti", root / "oti", "--out", phi,
                                         "--seed", s])
        if not test.is_file():
            _run(["eval", "--benchmark", "world", "--root", a.run / "world", "--split", "test", "--protocols",
                  ",".join(PROTOCOLS), "--methods", "searle", "--searle", phi, "--out", test])
        parts = json.loads(test.read_text())["parts"]
        results[s] = {p: {k: parts[f"world/{p}"]["methods"]["searle"][k] for k in ("R@1", "R@5", "R@10", "Rs@1")}
                      for p in PROTOCOLS}
    out = {"images": a.images, "seeds": seeds, "results": results, "seconds": times}
    (root / f"results-s{a.seeds.replace(',', '')}.json").write_text(json.dumps(out, indent=2) + "\n")

    def ms(xs):
        return f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else f"{xs[0]:.1f}"
    print("| method | seeds | " + " | ".join(f"{p} R@1 | {p} Rs@1" for p in PROTOCOLS) + " |")
    print("|---|---|" + "---|---|" * len(PROTOCOLS))
    runs = [results[s] for s in seeds]
    print(f"| searle (OTI on {a.images} images) | {len(seeds)} | " + " | ".join(
        f"{ms([r[p]['R@1'] for r in runs])} | {ms([r[p]['Rs@1'] for r in runs])}" for p in PROTOCOLS) + " |")


if __name__ == "__main__":
    main()
