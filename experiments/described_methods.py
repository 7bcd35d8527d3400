"""Every method on the described protocol's test split, once, after its share was fixed on val with the baselines
alone (`experiments/described_calibration.py`; issue 26).

    python experiments/quickstart_seeds.py --seeds 0,1,2 --out runs/seeds     # FoCo and foco-edits, 3 seeds
    OMP_NUM_THREADS=2 python experiments/described_methods.py --run runs/quickstart --seeds-dir runs/seeds

Per seed s: FoCo (paper recipe) and foco-edits (the demo's budget recipe) from SEEDS/seed-s, and a Pic2Word mapper
trained with `foco pic2word train`'s defaults (the reference's input and optimiser; 2 epochs, lr 5e-4, batch 128,
as experiments/pic2word_reference.py) on RUN/features/train with seed s. slerp's alpha is chosen on val/described;
sum, image and text have no seed. PACT and TSCIR take --pact/--tscir checkpoints (comma-separated, one per seed)
when given. Writes RUN/described-methods/{p2w-sS, test-sS.json, results.json} and prints the Markdown table
(mean +- sample sd over seeds). Reuses what an earlier run left.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from foco.ablation.stats import mean_sd
from foco.cli import main as foco
from foco.utils.io import atomic_write_text

SHOW = ("R@1", "R@5", "R@10", "Rs@1")
ORDER = ("foco", "foco-edits", "pact", "tscir", "pic2word", "slerp", "sum", "image", "text")


def _run(argv: list[str]) -> None:
    code = foco([str(a) for a in argv])
    if code != 0:
        raise SystemExit(f"foco {' '.join(map(str, argv))} exited {code}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/quickstart")
    ap.add_argument("--seeds-dir", default="runs/seeds")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--pact", default=None, help="PACT checkpoints, one per seed, comma-separated")
    ap.add_argument("--tscir", default=None, help="TSCIR checkpoints, one per seed, comma-separated")
    a = ap.parse_args()
    run, seeds_dir = Path(a.run), Path(a.seeds_dir)
    out = run / "described-methods"
    seeds = [int(s) for s in a.seeds.split(",")]
    backbone = json.loads((run / "foco" / "foco.json").read_text())["backbone"]
    t0 = time.time()
    for split in ("val", "test"):
        cache = run / "features" / f"{split}-described"
        _run(["features", "extract", "--backbone", backbone, "--world", run / "world", "--split",
              f"{split}/described", "--out", cache])
    pact = a.pact.split(",") if a.pact else []
    tscir = a.tscir.split(",") if a.tscir else []
    per_seed = {}
    for n, s in enumerate(seeds):
        p2w = out / f"p2w-s{s}"
        if not (p2w / "pic2word.safetensors").is_file():
            _run(["pic2word", "train", "--features", run / "features" / "train", "--out", p2w, "--epochs", "2",
                  "--lr", "5e-4", "--batch-size", "128", "--seed", s])
        seed_run = seeds_dir / f"seed-{s}"
        result = out / f"test-s{s}.json"
        if not result.is_file():
            _run(["eval", "--world", run / "world", "--features", run / "features", "--split", "test",
                  "--protocols", "described", "--methods", "foco,foco-edits,pic2word,slerp,sum,image,text",
                  "--checkpoint", seed_run / "foco", "--foco-edits", seed_run / "foco-edits", "--pic2word", p2w,
                  "--out", result])
        per_seed[s] = json.loads(result.read_text())
        # PACT and TSCIR, when given, in a file of their own: the methods above are evaluated once
        composers, extra = [], []
        if pact:
            composers.append("pact")
            extra += ["--pact", pact[n]]
        if tscir:
            composers.append("tscir")
            extra += ["--tscir", tscir[n]]
        if composers:
            more = out / f"test-{'-'.join(composers)}-s{s}.json"
            if not more.is_file():
                _run(["eval", "--world", run / "world", "--features", run / "features", "--split", "test",
                      "--protocols", "described", "--methods", ",".join(composers), *extra, "--out", more])
            per_seed[s]["methods"].update(json.loads(more.read_text())["methods"])
    rows = {}
    for name in ORDER:
        runs = [r["methods"][name] for r in per_seed.values() if name in r["methods"]]
        if runs:
            rows[name] = {k: dict(zip(("mean", "sd"), mean_sd([m[k] for m in runs]))) for k in SHOW}
            rows[name]["seeds"] = len(runs)
    chosen = {s: r["chosen"] for s, r in per_seed.items()}
    atomic_write_text(out / "results.json", json.dumps({"rows": rows, "seeds": seeds, "chosen": chosen,
                                                        "seconds": round(time.time() - t0, 1)}, indent=2) + "\n")
    print("| method | seeds | " + " | ".join(SHOW) + " |")
    print("|---|---|" + "---|" * len(SHOW))
    for name, row in rows.items():
        print(f"| {name} | {row['seeds']} | " + " | ".join(f"{row[k]['mean']:.1f} ± {row[k]['sd']:.1f}" for k in SHOW)
              + " |")


if __name__ == "__main__":
    main()
