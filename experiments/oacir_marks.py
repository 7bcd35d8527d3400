"""Do the frozen backbone's features tell an OACIR instance from its instance distractors (the same scene with
another mark)? For each query of a split: among its target and its instance distractors, how often is the target
the closest (cosine) to (a) the reference's global feature, (b) the reference's mean patch inside the box. Chance
is the mean of 1 / (1 + distractors). Near chance, no box method can recover the instance from these features.

    python experiments/oacir_marks.py --world runs/w --features runs/feats --split test
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from foco.benchmarks.world import load_world_part
from foco.eval.compose import box_masks, reference_rows
from foco.utils.io import read_jsonl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=Path, required=True)
    ap.add_argument("--features", type=Path, required=True, help="holds <split>-oacir")
    ap.add_argument("--split", default="test", choices=["train", "val", "test"])
    a = ap.parse_args()
    bench, feats = load_world_part(a.world, a.split, "oacir", a.features / f"{a.split}-oacir")
    recs = {r["id"]: r for r in read_jsonl(a.world / "benchmarks" / a.split / "oacir" / "queries.jsonl")}
    pos = {g: i for i, g in enumerate(feats.gallery_ids)}
    rows = reference_rows(bench, feats)  # (Q,)
    mask = box_masks(bench, feats.references.patches.shape[1]).float()  # (Q, P)
    patches = feats.references.patches[rows].float()  # (Q, P, D)
    in_box = F.normalize((patches * mask[..., None]).sum(1) / mask.sum(1, keepdim=True), dim=-1)  # (Q, D)
    glob = feats.references.global_[rows].float()  # (Q, D)
    hits_global = hits_box = chance = 0.0
    for i, q in enumerate(bench.queries):
        cand = feats.gallery[[pos[g] for g in [q.targets[0], *recs[q.id]["instance_distractors"]]]].float()
        hits_global += float((cand @ glob[i]).argmax() == 0)
        hits_box += float((cand @ in_box[i]).argmax() == 0)
        chance += 1 / len(cand)
    n = len(bench.queries)
    print(json.dumps({"split": a.split, "queries": n, "backbone": (feats.backbone or {}).get("spec"),
                      "target_first_by_reference_global_%": round(100 * hits_global / n, 2),
                      "target_first_by_box_patches_%": round(100 * hits_box / n, 2),
                      "chance_%": round(100 * chance / n, 2)}))


if __name__ == "__main__":
    main()
