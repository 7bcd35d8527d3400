"""How much a composed query depends on the modification text: for each query of a world benchmark, the cosine
between the query built with its own text and the query built with another query's text (1.0 = the text is
ignored), and the cosines of the query to the reference and to the target.

    python benchmarks/foco_text_reliance.py --world runs/quickstart/world --features runs/quickstart/features \
        --split test --checkpoints runs/quickstart/foco runs/ceiling30k
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from foco.backbones.base import TextFeatures
from foco.baselines import build_method
from foco.evaluate import compose_queries, load_benchmark_features


def reliance(method, bf, seed: int = 0) -> dict[str, float]:
    q = compose_queries(method, bf)  # (Q, D)
    perm = torch.randperm(len(q), generator=torch.Generator().manual_seed(seed))
    shuffled = replace(bf, texts=TextFeatures(bf.texts.global_[perm], bf.texts.tokens[perm], bf.texts.mask[perm]))
    q2 = compose_queries(method, shuffled)  # (Q, D), same references, other texts
    ref = bf.gallery.global_[bf.ref_index]  # (Q, D)
    tgt = bf.gallery.global_[torch.tensor([t[0] for t in bf.target_index])]  # (Q, D)
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
    bf = load_benchmark_features(a.world, a.split, "single", Path(a.features) / f"{a.split}-single")
    out = {"sum": reliance(build_method("sum", None), bf)}
    for ckpt in a.checkpoints:
        out[ckpt] = reliance(build_method("foco", ckpt), bf)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
