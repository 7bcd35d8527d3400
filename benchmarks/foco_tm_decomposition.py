"""Exploratory (issue 3): decomposing the modification text T_m at inference, the paper's optional variant (§3.4).

The anchor c that drives F_Aggr becomes a phrase of T_m found by the rule decomposer (its first noun chunk, e.g.
"the yellow square" in "change the yellow square into a cross"), and the context X stays T_m, so F_Aggr sees a
training-like local caption. Scored on the world's *val* benchmarks next to plain FoCo (c = X = T_m).

    python benchmarks/foco_tm_decomposition.py --run runs/quickstart --split val
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from foco.backbones.base import ImageFeatures
from foco.backbones.world import load_world_backbone
from foco.decompose.rule import RuleDecomposer
from foco.evaluate import compose_queries, load_benchmark_features, recall_by_edit_type, score_queries
from foco.model import ComposedQueryEncoder


def anchors_for(texts: list[str], mode: str, rule: RuleDecomposer) -> list[str]:
    if mode == "tm":
        return texts
    out = []
    for d in rule.decompose_batch(texts):
        locals_ = [p.local for p in d.pairs if p.context]  # a real chunk, not the whole-text fallback
        out.append(locals_[0] if locals_ else d.caption)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default="runs/quickstart")
    ap.add_argument("--split", default="val")
    ap.add_argument("--features", default=None, help="default: RUN/features (val caches may be in RUN/field/features)")
    a = ap.parse_args()
    run = Path(a.run)
    feats = Path(a.features) if a.features else run / "features"
    backbone = load_world_backbone(run / "backbone")
    model = ComposedQueryEncoder.load(run / "foco").eval()
    rule = RuleDecomposer()
    res = {}
    for protocol in ("single", "multi"):
        bf = load_benchmark_features(run / "world", a.split, protocol, feats / f"{a.split}-{protocol}")
        for mode in ("tm", "first_chunk"):
            anchors = anchors_for(bf.bench.modifications, mode, rule)
            with torch.no_grad():
                anchor_global = backbone.encode_texts(anchors).global_  # (Q, D)
                refs = ImageFeatures(bf.gallery.global_[bf.ref_index], bf.gallery.patches[bf.ref_index].float())
                v_loc, bg, _ = model.aggr(anchor_global[:, None], refs.global_, refs.patches)
                q = model.comp(v_loc, bg, bf.texts.tokens.float(), bf.texts.mask)[:, 0]  # (Q, D)
            m = res.setdefault(mode, {})
            m.update({k: round(v, 1) for k, v in score_queries(q, bf).items()})
            if protocol == "single":
                m["R@1_by_edit_type"] = {k: round(v, 1) for k, v in recall_by_edit_type(q, bf).items()}
                if mode == "tm":  # sanity: equals the encoder's own path
                    plain = compose_queries(model, bf)
                    assert torch.allclose(plain, q, atol=1e-4), "mismatch with ComposedQueryEncoder.encode"
                m["example_anchors"] = anchors[:6]
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
