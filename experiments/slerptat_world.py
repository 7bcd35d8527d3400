"""SlerpTAT on the world's test protocols, 3 seeds, beside slerp without its tuning (issue 57, item 5's SlerpTAT rows).

    OMP_NUM_THREADS=1 python experiments/slerptat_world.py --run runs/quickstart --seeds 0,1,2

The calibration, fixed before any TAT run saw a protocol (docs/benchmarks.md, "SlerpTAT on the world"):
* `paper`: `foco tat train`'s defaults, the paper's settings (LoRA r 16, alpha 16, dropout 0.1 on q/v of the
  image tower, AdamW lr 1e-4, batch 1024, fixed logit scale 1/0.07, ONE epoch), over the world's 10,000 training
  pairs, as every trained baseline of the table trains with its own defaults over the same pairs: 9 steps;
* `long`: the same for 10 epochs (90 steps), a labelled sensitivity row, because one epoch of 10,000 pairs is
  1/200 of the paper's steps (one epoch of LAION-2M at batch 1024 is about 2,000).
Each on `world:vit`, seeds 0-2; alpha chosen on each protocol's val split (`--slerp-alpha val`), as slerp's.
Per seed it evaluates test single, described and restaged with the tuned backbone `tat:FOLDER` (its own feature
caches), and slerp once on `world:vit`'s. Writes RUN/slerptat/{RECIPE-sS/, results-RECIPES-sSEEDS.json} and
prints the table (mean +- sample sd) with slerp-tat minus slerp, R@1 by protocol. Reuses what an earlier run left.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from foco.cli import main as foco

RECIPES = {"paper": [], "long": ["--epochs", "10"]}
PROTOCOLS = ("single", "described", "restaged")


def _run(args: list) -> float:
    """Runs one foco command in this process; exits naming it on failure. Returns its seconds."""
    args = [str(a) for a in args]
    t0 = time.time()
    if foco(args) != 0:
        raise SystemExit(f"foco {' '.join(args)} failed")
    print(f"[{time.time() - t0:.0f} s] foco {' '.join(args[:3])} ...", flush=True)
    return time.time() - t0


def _evaluate(run: Path, out: Path, method: str, extra: list) -> dict:
    """{protocol: R@1, R@5, R@10, Rs@1} of `method` on the test protocols, alpha chosen on val."""
    if not out.is_file():
        _run(["eval", "--benchmark", "world", "--root", run / "world", "--split", "test", "--protocols",
              ",".join(PROTOCOLS), "--methods", method, "--slerp-alpha", "val", "--out", out, *extra])
    parts = json.loads(out.read_text())["parts"]
    chosen = json.loads(out.read_text())["chosen"]
    return {p: {**{k: parts[f"world/{p}"]["methods"][method][k] for k in ("R@1", "R@5", "R@10", "Rs@1")},
                "alpha": chosen.get(f"slerp alpha ({p})")} for p in PROTOCOLS}


def _ms(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.1f} ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else f"{xs[0]:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a quickstart run (its world, with described and "
                                                             "restaged)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--recipes", default="paper,long")
    ap.add_argument("--backbone", default="world:vit")
    a = ap.parse_args()
    root = a.run / "slerptat"
    seeds = [int(s) for s in a.seeds.split(",")]
    results = {"slerp": _evaluate(a.run, root / "slerp-test.json", "slerp", ["--backbone", a.backbone])}
    for recipe in a.recipes.split(","):
        results[recipe] = {}
        for s in seeds:
            folder = root / f"{recipe}-s{s}"
            if not (folder / "tat.json").is_file():
                _run(["tat", "train", "--world", a.run / "world", "--backbone", a.backbone, "--out", folder,
                      "--seed", s, *RECIPES[recipe]])
            rec = json.loads((folder / "tat.json").read_text())
            results[recipe][s] = {"test": _evaluate(a.run, folder / "test.json", "slerp-tat", ["--tat", folder]),
                                  "train": {k: rec[k] for k in ("lora", "adapter_sha256")},
                                  "seconds": json.loads((folder / "train_log.jsonl").read_text().splitlines()[-1])
                                  .get("elapsed_s")}
    name = f"results-{a.recipes.replace(',', '+')}-s{a.seeds.replace(',', '')}.json"  # one file per selection
    (root / name).write_text(json.dumps(results, indent=2) + "\n")
    print("| method | seeds | " + " | ".join(f"{p} R@1 | {p} Rs@1" for p in PROTOCOLS) + " | alpha (val) |")
    print("|---|---|" + "---|---|" * len(PROTOCOLS) + "---|")
    sl = results["slerp"]
    print(f"| slerp (untuned `{a.backbone}`) | – | " + " | ".join(f"{sl[p]['R@1']:.1f} | {sl[p]['Rs@1']:.1f}"
                                                                 for p in PROTOCOLS)
          + " | " + ", ".join(f"{sl[p]['alpha']}" for p in PROTOCOLS) + " |")
    for recipe in a.recipes.split(","):
        runs = [results[recipe][s]["test"] for s in seeds]
        cells = " | ".join(f"{_ms([r[p]['R@1'] for r in runs])} | {_ms([r[p]['Rs@1'] for r in runs])}"
                           for p in PROTOCOLS)
        alphas = ", ".join("/".join(str(r[p]["alpha"]) for r in runs) for p in PROTOCOLS)
        print(f"| slerp-tat, {recipe} | {len(seeds)} | {cells} | {alphas} |")
        diffs = " | ".join(f"{_ms([r[p]['R@1'] - sl[p]['R@1'] for r in runs])} | –" for p in PROTOCOLS)
        print(f"| slerp-tat, {recipe} − slerp (R@1) | {len(seeds)} | {diffs} | – |")


if __name__ == "__main__":
    main()
