"""How much a composed query depends on the modification text: for each query of a world benchmark, the cosine
between the query built with its own text and the query built with another query's text (1.0 = the text is
ignored), and the cosines of the query to the reference and to the target.

    python experiments/foco_text_reliance.py --world runs/quickstart/world --features runs/quickstart/features \
        --split test --checkpoints runs/quickstart/foco runs/ceiling30k
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from foco.benchmarks.base import CIRBenchmark
from foco.benchmarks.cache import PartFeatures
from foco.benchmarks.world import load_world_part
from foco.eval.compose import compose, reference_rows
from foco.methods import build_method


def reliance(method, bench: CIRBenchmark, feats: PartFeatures, seed: int = 0) -> dict[str, float]:
    q = compose(method, bench, feats).query  # (Q, D)
    perm = torch.randperm(len(q), generator=torch.Generator().manual_seed(seed))
    shuffled = replace(bench, queries=[replace(query, texts=bench.queries[j].texts)
                                       for query, j in zip(bench.queries, perm.tolist())])
    q2 = compose(method, shuffled, feats).query  # (Q, D), same references, other texts
    ref = feats.references.global_[reference_rows(bench, feats)]  # (Q, D)
    pos = {g: i for i, g in enumerate(feats.gallery_ids)}
    tgt = feats.gallery[torch.tensor([pos[query.targets[0]] for query in bench.queries])]  # (Q, D)
    med = lambda x: round(float(x.median()), 3)  # noqa: E731
    return {"cos(query, query with another text)": med((q * q2).sum(-1)),
            "cos(query, reference)": med((q * ref).sum(-1)), "cos(query, target)": med((q * tgt).sum(-1)),
            "cos(reference, target)": med((ref * tgt).sum(-1))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", required=True)
    ap.add_argument("--features", required=True)
    ap.add_argument("--split", default="test")
    ap.add_argument("--checkpoints", nargs="+", required=True, help="FoCo-architecture checkpoint folders")
    a = ap.parse_args()
    bench, feats = load_world_part(a.world, a.split, "single", Path(a.features) / f"{a.split}-single")
    out = {"sum": reliance(build_method("sum"), bench, feats)}
    for ckpt in a.checkpoints:
        out[ckpt] = reliance(build_method("foco", ckpt), bench, feats)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
