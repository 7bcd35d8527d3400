"""How much of F_Aggr's attention falls in the layout cell of the object an anchor refers to (uniform: 25 %).

Training-style anchors: the local captions of the first 512 training pairs (their grounding names the object).
Inference anchors: the modification texts of the test `single` object edits (the edit names the object).

    python experiments/attention_localization.py --run runs/quickstart
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch

from foco.benchmarks.world import load_world_part
from foco.eval.compose import compose
from foco.methods.foco import FoCoMethod
from foco.model import ComposedQueryEncoder
from foco.train.data import build_pair_table
from foco.utils.io import read_jsonl
from foco.world.manifest import load_pairs


def cell_mask(cell: int, grid: int = 8) -> torch.Tensor:
    r, c = divmod(cell, 2)
    m = torch.zeros(grid, grid)
    m[r * grid // 2:(r + 1) * grid // 2, c * grid // 2:(c + 1) * grid // 2] = 1
    return m.flatten()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True, help="a quickstart output folder")
    a = ap.parse_args()
    R = a.run
    model = ComposedQueryEncoder.load(f"{R}/foco")
    res = {}
    recs = read_jsonl(f"{R}/world/pairs/train.jsonl")[:512]
    table = build_pair_table(f"{R}/features/train", {p.id: p.decomposition for p in load_pairs(f"{R}/world", "train")})
    b = table.batch(torch.arange(len(recs)))
    with torch.inference_mode():
        _, _, att = model.aggr(b.local, b.image_global, b.patches)  # (B, K, P)
    masses = [float((att[i, k] * cell_mask(r["scene"]["objects"][int(g.split(":")[1])]["cell"])).sum())
              for i, r in enumerate(recs) for k, g in enumerate(r["grounding"])
              if g.startswith("object:") and k < att.shape[1]]
    res["local captions (training anchors)"] = round(sum(masses) / len(masses), 3)
    bench, feats = load_world_part(f"{R}/world", "test", "single", f"{R}/features/test-single")
    qs = read_jsonl(f"{R}/world/benchmarks/test/single/queries.jsonl")
    gal = {g["id"]: g["scene"] for g in read_jsonl(f"{R}/world/benchmarks/test/single/gallery.jsonl")}
    out = compose(FoCoMethod(model), bench, feats)  # attention (Q, P), in the order of qs
    by_type = defaultdict(list)
    for q, rec in enumerate(qs):
        if rec["edit"]["index"] is not None:
            cell = gal[rec["reference"]]["objects"][rec["edit"]["index"]]["cell"]
            by_type[rec["edit"]["type"]].append(float((out.attention[q] * cell_mask(cell)).sum()))
    res["modification texts (inference anchors)"] = {t: round(sum(v) / len(v), 3) for t, v in sorted(by_type.items())}
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
