"""Context-I2W and its +AD control on the world's test protocols, 3 seeds each (issue 57, item 5's Context-I2W rows).

    OMP_NUM_THREADS=1 python experiments/context_i2w_world.py --run runs/quickstart --seeds 0,1,2

The calibration, fixed before any Context-I2W run saw a protocol (docs/history.md, "Issue 57: Context-I2W's
calibration"):
* `foco context-i2w train` with the reference's settings (AdamW 5e-4, betas 0.9/0.98, eps 1e-6, decay 0.2 but on
  norms and biases, batch 64, dropout 0.1, the backbone's temperature, cosine to 0) on `world:vit`'s training cache
  and the world's 10,000 captions, subject masked, for ONE epoch (the CPU's budget: about 1.2 s a step on one core);
* the warm-up is 5 % of the run's steps (the loop's default for every trainer), not the reference's 10,000 steps: a
  run of 156 steps would never leave a 10,000-step warm-up (its rate would end at 1.6 % of the peak);
* `ad`: the same with `--add-decompositions` (each caption's decomposition pairs, rejoined, as extra pairs of the
  same image), for one epoch over its larger set of pairs, as the paper adds the pairs;
* the query "a photo of * , {modification}" (eval_utils.py's CIRR prompt), the prompt itself the context; nothing
  chosen on val.
Writes RUN/context-i2w/{RECIPE-sS/, test-RECIPE-sS.json, results-sSEEDS.json} and prints R@1 and Rs@1 per protocol
(mean +- sample sd). Reuses what an earlier run left.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from slerptat_world import _run  # one runner of foco commands for the issue-57 experiments

PROTOCOLS = ("single", "described", "restaged")
RECIPES = {"plain": [], "ad": ["--add-decompositions"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a quickstart run (its world and train features)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--recipes", default="plain,ad")
    a = ap.parse_args()
    from foco.train.context_i2w import context_pairs
    root = a.run / "context-i2w"
    seeds = [int(s) for s in a.seeds.split(",")]
    results, times = {}, {}
    for recipe in a.recipes.split(","):
        pairs = len(context_pairs(a.run / "world", "train", recipe == "ad")[0])
        warmup = max(1, round(0.05 * (pairs // 64)))
        results[recipe] = {}
        for s in seeds:
            out, test = root / f"{recipe}-s{s}", root / f"test-{recipe}-s{s}.json"
            if not (out / "context_i2w.json").is_file():
                times[f"{recipe}_s{s}_s"] = _run(["context-i2w", "train", "--features", a.run / "features" / "train",
                                                  "--world", a.run / "world", "--out", out, "--epochs", 1,
                                                  "--warmup-steps", warmup, "--seed", s, *RECIPES[recipe]])
            if not test.is_file():
                _run(["eval", "--benchmark", "world", "--root", a.run / "world", "--split", "test", "--protocols",
                      ",".join(PROTOCOLS), "--methods", "context-i2w", "--context-i2w", out, "--out", test])
            parts = json.loads(test.read_text())["parts"]
            results[recipe][s] = {p: {k: parts[f"world/{p}"]["methods"]["context-i2w"][k]
                                      for k in ("R@1", "R@5", "R@10", "Rs@1")} for p in PROTOCOLS}
    (root / f"results-s{a.seeds.replace(',', '')}.json").write_text(
        json.dumps({"seeds": seeds, "results": results, "seconds": times}, indent=2) + "\n")

    def ms(xs):
        return f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else f"{xs[0]:.1f}"
    print("| method | seeds | " + " | ".join(f"{p} R@1 | {p} Rs@1" for p in PROTOCOLS) + " |")
    print("|---|---|" + "---|---|" * len(PROTOCOLS))
    for recipe, rows in results.items():
        runs = [rows[s] for s in seeds]
        print(f"| context-i2w{' +AD' if recipe == 'ad' else ''} | {len(seeds)} | " + " | ".join(
            f"{ms([r[p]['R@1'] for r in runs])} | {ms([r[p]['Rs@1'] for r in runs])}" for p in PROTOCOLS) + " |")


if __name__ == "__main__":
    main()
