"""The background feature's readings after `foco ablate --variants backgrounds`: per reading, mean over seeds of
R@1 per edit type (single protocol, evaluated again here with the categories) and text reliance (the median cosine between a query and the query with the
same reference under another query's text; 1.0 = the text is ignored), from the checkpoints it trained.

    python experiments/background_readings.py --out runs/ablate-bg --world runs/quickstart/world \
        --features runs/quickstart/features --recipe paper --split val
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from foco_text_reliance import reliance  # noqa: E402

from foco.ablation.variants import background_variants  # noqa: E402
from foco.benchmarks.world import load_world_part  # noqa: E402
from foco.eval.evaluate import EvalConfig, evaluate  # noqa: E402
from foco.methods import MethodOptions, build_method  # noqa: E402

RELIANCE = "cos(query, query with another text)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the foco ablate --out folder")
    ap.add_argument("--world", required=True)
    ap.add_argument("--features", required=True)
    ap.add_argument("--recipe", default="paper")
    ap.add_argument("--split", default="val")
    a = ap.parse_args()
    bench, feats = load_world_part(a.world, a.split, "single", Path(a.features) / f"{a.split}-single")
    table = {}
    for name in background_variants():
        per_type: dict[str, list[float]] = {}
        rel = []
        for seed_dir in sorted((Path(a.out) / a.recipe / name).glob("seed*")):
            res = evaluate([bench], lambda b: feats, EvalConfig(methods=("foco",), by_category=True,
                                                                 options=MethodOptions(checkpoint=seed_dir)))
            for t, v in res["parts"][bench.name]["R@1_by_category"]["foco"].items():
                per_type.setdefault(t, []).append(v["R@1"] if isinstance(v, dict) else v)
            method = build_method("foco", seed_dir)
            rel.append(reliance(method, bench, feats)[RELIANCE])
        table[name] = {"seeds": len(rel), "text_reliance": round(statistics.mean(rel), 3),
                       "R@1_by_edit_type": {t: round(statistics.mean(v), 1) for t, v in sorted(per_type.items())}}
    types = sorted({t for r in table.values() for t in r["R@1_by_edit_type"]})
    print(f"| reading ({a.recipe}, {a.split}) | text reliance | " + " | ".join(f"R@1 {t}" for t in types) + " |")
    print("|---|---|" + "---|" * len(types))
    for name, r in table.items():
        print(f"| {name} | {r['text_reliance']:.3f} | "
              + " | ".join(f"{r['R@1_by_edit_type'].get(t, float('nan')):.1f}" for t in types) + " |")
    Path(a.out, f"background-readings-{a.recipe}-{a.split}.json").write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
