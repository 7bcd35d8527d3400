"""Exploratory (issue 3): decomposing the modification text T_m at inference, the paper's optional variant (§3.4).

The anchor c that drives F_Aggr becomes a phrase of T_m found by the rule decomposer (its first noun chunk, e.g.
"the yellow square" in "change the yellow square into a cross"), and the context X stays T_m, so F_Aggr sees a
training-like local caption. Scored on the world's *val* benchmarks next to plain FoCo (c = X = T_m).

    python experiments/foco_tm_decomposition.py --run runs/quickstart --split val
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from foco.backbones.world import load_world_backbone
from foco.benchmarks.world import load_world_part
from foco.decompose.rule import RuleDecomposer
from foco.eval.compose import compose
from foco.eval.rank import rank, score, score_by_category
from foco.methods import build_method


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
    foco = build_method("foco", run / "foco")
    rule = RuleDecomposer()
    res = {}
    for protocol in ("single", "multi"):
        bench, part = load_world_part(run / "world", a.split, protocol, feats / f"{a.split}-{protocol}")
        for mode in ("tm", "first_chunk"):
            anchors = anchors_for([q.texts[0] for q in bench.queries], mode, rule)
            with torch.no_grad():
                anchor_global = backbone.encode_texts(anchors).global_  # (Q, D)
            q = compose(foco, bench, part, anchors=anchor_global).query  # (Q, D)
            ranked = rank(bench, part.gallery_ids, part.gallery, q)
            m = res.setdefault(mode, {})
            m.update({k: round(v, 1) for k, v in score(bench, ranked).items()})
            if protocol == "single":
                m["R@1_by_edit_type"] = {k: round(v, 1) for k, v in score_by_category(bench, ranked).items()}
                if mode == "tm":  # sanity: T_m re-encoded as the anchor equals the encoder's own path (cached T_m)
                    plain = compose(foco, bench, part).query
                    assert torch.allclose(plain, q, atol=1e-4), "mismatch with ComposedQueryEncoder.encode"
                m["example_anchors"] = anchors[:6]
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
