"""Train FoCo variants on a world's cached training features and score them on the world's *val* benchmarks,
next to the simple baselines, with R@1 per edit type. Used for the settings and ablations in docs/benchmarks.md.

    # once: world, backbone, features (train without captions; val benchmarks)
    foco world generate --out runs/world --size default
    foco backbone train --world runs/world --out runs/backbone
    for s in train val/single val/multi; do foco features extract --backbone world:runs/backbone \
        --world runs/world --split $s --out runs/features/${s/\//-}; done
    # then, per variant (JSON overrides of FoCoTrainConfig; "model" overrides FoCoConfig):
    python experiments/foco_variants.py --world runs/world --features runs/features --out runs/variants/bias \
        --config '{"stage1_epochs":2,"stage2_epochs":3,"batch_size":128,"lr_stage1":1e-3,"lr_aggr":3e-4,
                   "lr_comp":3e-4,"max_negatives":31,"model":{"learn_bias":true}}' --pairs 5000
"""
from __future__ import annotations

import argparse
from dataclasses import replace
import json
import time
from pathlib import Path


from foco.benchmarks.world import load_world_part
from foco.eval.compose import compose
from foco.eval.rank import rank, score, score_by_category
from foco.methods import build_method
from foco.model import FoCoConfig
from foco.train.data import PairTable, build_pair_table
from foco.train.foco import FoCoTrainConfig, train_foco
from foco.world.manifest import load_pairs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", required=True)
    ap.add_argument("--features", required=True, help="folder with train/, val-single/, val-multi/ caches")
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default="{}")
    ap.add_argument("--pairs", type=int, default=None, help="train on the first N pairs only")
    ap.add_argument("--local-context-prob", type=float, default=0.0,
                    help="exploratory: replace this fraction of contextual captions by their local caption")
    ap.add_argument("--background-dropout", type=float, default=0.0,
                    help="exploratory: during training, zero F_Comp's background input with this probability per "
                         "query, so that the contextual caption must supply the rest of the scene")
    a = ap.parse_args()
    kw = json.loads(a.config)
    if a.background_dropout > 0:  # foco's own switch (FoCoConfig.background_dropout), NOT in the paper
        kw.setdefault("model", {})["background_dropout"] = a.background_dropout
    cfg = FoCoTrainConfig(**{k: v for k, v in kw.items() if k != "model"}, model=FoCoConfig(**kw.get("model", {})))
    feats = Path(a.features)
    table = build_pair_table(feats / "train", {p.id: p.decomposition for p in load_pairs(a.world, "train")})
    if a.pairs and a.pairs < len(table):
        n = a.pairs
        table = PairTable(table.image_global[:n], table.patches[:n], table.text_global, table.text_tokens,
                          table.text_mask, table.local_idx[:n], table.context_idx[:n])
    if a.local_context_prob > 0:  # foco's own switch (FoCoTrainConfig.focus_in_context), NOT in the paper
        cfg = replace(cfg, focus_in_context=a.local_context_prob)
    t = time.time()
    train_foco(table, a.out, cfg)
    res = {"config": kw, "local_context_prob": a.local_context_prob, "background_dropout": a.background_dropout,
           "pairs": len(table), "train_s": round(time.time() - t, 1), "val": {}}
    for proto in ("single", "multi"):
        bench, part = load_world_part(a.world, "val", proto, feats / f"val-{proto}")
        for name in ("foco", "image", "text", "sum"):
            q = compose(build_method(name, a.out if name == "foco" else None), bench, part).query
            ranked = rank(bench, part.gallery_ids, part.gallery, q)
            m = res["val"].setdefault(name, {})
            m.update({k: round(v, 1) for k, v in score(bench, ranked).items()})
            if proto == "single":
                m["R@1_by_edit_type"] = {k: round(v, 1) for k, v in score_by_category(bench, ranked).items()}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
