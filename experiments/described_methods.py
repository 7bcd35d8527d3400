"""Every method on the described protocol's test split, once, after its share was fixed on val with the baselines
alone (`experiments/described_calibration.py`; issue 26).

    python experiments/quickstart_seeds.py --seeds 0,1,2 --out runs/seeds     # FoCo and foco-edits, 3 seeds
    OMP_NUM_THREADS=2 python experiments/described_methods.py --run runs/quickstart --seeds-dir runs/seeds

Per seed s: FoCo (paper recipe) and foco-edits (the demo's budget recipe) from SEEDS/seed-s, and a Pic2Word mapper
trained with `foco pic2word train`'s defaults (the reference's input and optimiser; 2 epochs, lr 5e-4, batch 128,
as experiments/pic2word_reference.py) on RUN/features/train with seed s. slerp's alpha is chosen on val/described;
sum, image and text have no seed. PACT and TSCIR take --pact/--tscir checkpoints (comma-separated, one per seed)
when given. Writes RUN/described-methods/{p2w-sS, test-sS.json, results.json} and prints the Markdown table
(mean +- sample sd over seeds), with each trained method's text reliance (median cos between its query with its
own text and with another query's; experiments/foco_text_reliance.py). --protocols single,described evaluates
both, into RUN/described-methods/results-single-described.json. Reuses what an earlier run left.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from foco.ablation.stats import mean_sd, sign_verdict
from foco.cli import main as foco
from foco.utils.io import atomic_write_text

SHOW = ("R@1", "R@5", "R@10", "Rs@1")
# paired by seed, R@1: (method, against, the paper's sign, what the paper says); the paper's +AD rows change by at
# most +0.3 (Context-I2W) and -0.3 (LinCIR, CIRCO mAP@5): "marginal or even negative", so no sign is claimed there
PAIRED = (("lincir+ad", "lincir", 0, "+AD: marginal or negative (at most +0.3; LinCIR -0.3 CIRCO mAP@5)"),
          ("foco", "lincir", 1, "FoCo above LinCIR"), ("foco", "lincir+ad", 1, "FoCo above every +AD baseline"),
          ("foco", "pic2word", 1, "FoCo above Pic2Word"),
          ("foco", "slerp", 1, "FoCo above SlerpTAT (here slerp without its tuning)"))
ORDER = ("foco", "foco-edits", "pact", "tscir", "pic2word", "lincir", "lincir+ad", "slerp", "sum", "image", "text")


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
    ap.add_argument("--protocols", default="described", help="comma-separated test protocols, e.g. single,described")
    ap.add_argument("--lincir", action="store_true",
                    help="also LinCIR and LinCIR +AD (the decompositions rejoined as extra captions), trained here per "
                         "seed with `foco lincir train`'s defaults on RUN/world's train captions (issue 40)")
    a = ap.parse_args()
    run, seeds_dir = Path(a.run), Path(a.seeds_dir)
    out = run / "described-methods"
    seeds = [int(s) for s in a.seeds.split(",")]
    backbone = json.loads((run / "foco" / "foco.json").read_text())["backbone"]
    # the run's own encoding precision: the quickstart's feature caches were extracted at it, and a cache refuses
    # to be extended at another
    report = run / "results.json"
    precision = json.loads(report.read_text()).get("precision", "fp32") if report.is_file() else "fp32"
    t0 = time.time()
    for split in ("val", "test"):
        for protocol in a.protocols.split(","):
            cache = run / "features" / f"{split}-{protocol}"
            _run(["features", "extract", "--backbone", backbone, "--world", run / "world", "--split",
                  f"{split}/{protocol}", "--out", cache, "--precision", precision])
    pact = a.pact.split(",") if a.pact else []
    tscir = a.tscir.split(",") if a.tscir else []
    protocols = a.protocols.split(",")
    spec = json.loads((run / "backbone.json").read_text())["backbone"] if (run / "backbone.json").is_file() \
        else backbone
    per_seed = {p: {} for p in protocols}
    reliance_rows: dict[str, dict[str, list[float]]] = {p: {} for p in protocols}
    for n, s in enumerate(seeds):
        p2w = out / f"p2w-s{s}"
        if not (p2w / "pic2word.safetensors").is_file():
            _run(["pic2word", "train", "--features", run / "features" / "train", "--out", p2w, "--epochs", "2",
                  "--lr", "5e-4", "--batch-size", "128", "--seed", s])
        seed_run = seeds_dir / f"seed-{s}"
        trained = {"foco": {"checkpoint": seed_run / "foco"}, "foco-edits": {"foco_edits": seed_run / "foco-edits"},
                   "pic2word": {"pic2word": p2w}}
        if pact:
            trained["pact"] = {"pact": Path(pact[n])}
        if tscir:
            trained["tscir"] = {"tscir": Path(tscir[n])}
        lincirs = {}
        if a.lincir:
            for label, extra in (("lincir", []), ("lincir+ad", ["--add-decompositions"])):
                folder = out / f"{label.replace('+', '-')}-s{s}"
                if not (folder / "lincir.safetensors").is_file():
                    _run(["lincir", "train", "--world", run / "world", "--backbone", spec, "--out", folder,
                          "--seed", s, *extra])  # an interrupted run in the folder is continued
                lincirs[label] = folder
                trained[label] = {"_method": "lincir", "lincir": folder}
        for protocol in protocols:
            tag = "" if protocol == "described" else f"{protocol}-"
            result = out / f"test-{tag}s{s}.json"
            if not result.is_file():
                _run(["eval", "--world", run / "world", "--features", run / "features", "--split", "test",
                      "--protocols", protocol, "--methods", "foco,foco-edits,pic2word,slerp,sum,image,text",
                      "--checkpoint", seed_run / "foco", "--foco-edits", seed_run / "foco-edits", "--pic2word", p2w,
                      "--out", result])
            per_seed[protocol][s] = json.loads(result.read_text())
            # PACT and TSCIR, when given, in a file of their own: the methods above are evaluated once
            composers, extra = [], []
            if pact:
                composers.append("pact")
                extra += ["--pact", pact[n]]
            if tscir:
                composers.append("tscir")
                extra += ["--tscir", tscir[n]]
            if composers:
                more = out / f"test-{tag}{'-'.join(composers)}-s{s}.json"
                if not more.is_file():
                    _run(["eval", "--world", run / "world", "--features", run / "features", "--split", "test",
                          "--protocols", protocol, "--methods", ",".join(composers), *extra, "--out", more])
                per_seed[protocol][s]["methods"].update(json.loads(more.read_text())["methods"])
            for label, folder in lincirs.items():  # one file each: both are the method "lincir"
                more = out / f"test-{tag}{label.replace('+', '-')}-s{s}.json"
                if not more.is_file():
                    _run(["eval", "--world", run / "world", "--features", run / "features", "--split", "test",
                          "--protocols", protocol, "--methods", "lincir", "--lincir", folder, "--out", more])
                per_seed[protocol][s]["methods"][label] = json.loads(more.read_text())["methods"]["lincir"]
            for name, value in _reliance(run, protocol, spec, trained, out / f"reliance-{tag}s{s}.json").items():
                reliance_rows[protocol].setdefault(name, []).append(value)
    tables = {}
    for protocol in protocols:
        rows = {}
        for name in ORDER:
            runs = [r["methods"][name] for r in per_seed[protocol].values() if name in r["methods"]]
            if runs:
                rows[name] = {k: dict(zip(("mean", "sd"), mean_sd([m[k] for m in runs]))) for k in SHOW}
                rows[name]["seeds"] = len(runs)
                if name in reliance_rows[protocol]:
                    rows[name]["text reliance"] = dict(zip(("mean", "sd"), mean_sd(reliance_rows[protocol][name])))
        paired = {}
        for method, base, sign, says in PAIRED:
            both = [s for s, r in per_seed[protocol].items() if method in r["methods"] and base in r["methods"]]
            if not both:
                continue
            deltas = [per_seed[protocol][s]["methods"][method]["R@1"] - per_seed[protocol][s]["methods"][base]["R@1"]
                      for s in both]
            m, sd = mean_sd(deltas)
            entry = {"seeds": both, "deltas": deltas, "mean": m, "sd": sd, "paper": says}
            if sign and len(both) >= 2:
                entry.update(sign_verdict(deltas, sign))
            paired[f"{method} - {base}"] = entry
        tables[protocol] = {"rows": rows, "paired R@1": paired,
                            "chosen": {s: r["chosen"] for s, r in per_seed[protocol].items()}}
    name = "results.json" if protocols == ["described"] else f"results-{'-'.join(protocols)}.json"
    atomic_write_text(out / name, json.dumps({"protocols": tables, "seeds": seeds,
                                              "seconds": round(time.time() - t0, 1)}, indent=2) + "\n")
    for protocol, table in tables.items():
        print(f"\n{protocol}, test\n")
        print("| method | seeds | " + " | ".join(SHOW) + " | text reliance |")
        print("|---|---|" + "---|" * (len(SHOW) + 1))
        for method, row in table["rows"].items():
            rel = row.get("text reliance")
            print(f"| {method} | {row['seeds']} | " + " | ".join(f"{row[k]['mean']:.1f} ± {row[k]['sd']:.1f}"
                                                              for k in SHOW)
                  + (f" | {rel['mean']:.3f} ± {rel['sd']:.3f} |" if rel else " | – |"))
        if table["paired R@1"]:
            print("\n| paired by seed | ΔR@1 | seeds | the paper | sign agrees | beyond noise (t) |")
            print("|---|---|---|---|---|---|")
            for key, e in table["paired R@1"].items():
                verdict = (("yes" if e["agrees"] else "no"), ("yes" if e["counts"] else "no") + f" ({e['t']:.2f})") \
                    if "agrees" in e and e.get("t") is not None else ("–", "–")
                print(f"| {key} | {e['mean']:+.1f} ± {e['sd']:.1f} | {len(e['seeds'])} | {e['paper']} | "
                      f"{verdict[0]} | {verdict[1]} |")


def _reliance(run: Path, protocol: str, spec: str, trained: dict, cache: Path) -> dict[str, float]:
    """Text reliance of each trained method (experiments/foco_text_reliance.py), cached per method in `cache`."""
    out = json.loads(cache.read_text()) if cache.is_file() else {}
    todo = {name: options for name, options in trained.items() if name not in out}
    if not todo:
        return {name: out[name] for name in trained}
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from foco_text_reliance import reliance

    from foco import create_backbone
    from foco.benchmarks.world import load_world_part
    from foco.methods import build_method
    bench, feats = load_world_part(run / "world", "test", protocol, run / "features" / f"test-{protocol}")
    backbone = create_backbone(spec)
    for name, options in todo.items():
        options = dict(options)
        method = build_method(options.pop("_method", name), backbone=backbone, **options)
        out[name] = reliance(method, bench, feats)["cos(query, query with another text)"]
    atomic_write_text(cache, json.dumps(out, indent=1) + "\n")
    return {name: out[name] for name in trained}


if __name__ == "__main__":
    main()
