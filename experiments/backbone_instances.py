"""Issue 56's table, measured on a world backbone before any method sees it: retrieval, geometry and the instance
check, each backbone encoding the same images itself.

* retrieval: caption -> image and image -> caption R@1 on the world's `backbone_val` pairs (the figures `foco
  backbone train` records), through the public encode API;
* geometry: cos(global, mean patch) and the held-out mean patch -> global linear map (cos, R@1) on the val and test
  `single` galleries, as `backbone_geometry.py` measures them;
* the instance check on an OACIR split (`oacir_marks.py`'s rule): for each query, among its target and its
  instance distractors (the target with the anchored shape's mark replaced), how often the target is the closest
  (cosine) to the reference's global, and to the reference's mean patch inside its box; chance is the mean of
  1 / (1 + distractors). It also gives the mean cosine between a target and its instance distractors (1.0: the
  backbone cannot tell the marks apart at all), and both rates by the anchored shape's size (a small shape's mark
  is 4-6 pixels, a large one's about 12: whether the marks are legible to 8 x 8 patches).

    python experiments/backbone_instances.py --world runs/w100k/world --split test \
        --backbone world:vit --backbone world:vit-marks --out runs/marks/table.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from backbone_geometry import encode, held_out_images, linear_map  # noqa: E402

from foco.backbones import create_backbone  # noqa: E402
from foco.benchmarks.world import read_world  # noqa: E402
from foco.model.box import query_box_masks  # noqa: E402
from foco.train.world_backbone import evaluate_backbone  # noqa: E402
from foco.utils.io import read_jsonl  # noqa: E402


def instance_check(backbone, world: Path, split: str) -> dict:
    """The target's rank among its mark twins by the reference's global and by its in-box mean patch."""
    bench = read_world(world, split, ("oacir",))[0]
    recs = {r["id"]: r for r in read_jsonl(world / "benchmarks" / split / "oacir" / "queries.jsonl")}
    cands = [[q.targets[0], *recs[q.id]["instance_distractors"]] for q in bench.queries]
    need = sorted({g for c in cands for g in c})
    gal, _ = encode(backbone, [bench.images[g].path for g in need])  # (G, D)
    row = {g: i for i, g in enumerate(need)}
    ref_g, ref_p = encode(backbone, [bench.images[q.reference].path for q in bench.queries])  # (Q, D), (Q, P, D)
    mask = query_box_masks(bench.queries, ref_p.shape[1]).float()  # (Q, P)
    in_box = F.normalize((ref_p.float() * mask[..., None]).sum(1) / mask.sum(1, keepdim=True), dim=-1)  # (Q, D)
    scenes = {r["id"]: r["scene"] for r in read_jsonl(world / "benchmarks" / split / "oacir" / "gallery.jsonl")}
    sizes = [next(o["size"] for o in scenes[q.reference]["objects"]
                  if f"{o['kind']}/{o['colour']}/{o.get('mark')}" == q.instance) for q in bench.queries]
    hits_g, hits_b, chance, twin_cos = [], [], [], []
    for i, c in enumerate(cands):
        cand = F.normalize(gal[[row[g] for g in c]].float(), dim=-1)  # (1 + k, D), the target first
        hits_g.append(float((cand @ F.normalize(ref_g[i].float(), dim=-1)).argmax() == 0))
        hits_b.append(float((cand @ in_box[i]).argmax() == 0))
        chance.append(1 / len(c))
        twin_cos.append(float((cand[1:] @ cand[0]).mean()))

    def rates(keep: list[bool]) -> dict:
        n = sum(keep)
        pct = lambda xs: round(100 * sum(x for x, k in zip(xs, keep) if k) / n, 2)  # noqa: E731
        return {"queries": n, "by_reference_global_%": pct(hits_g), "by_box_patches_%": pct(hits_b),
                "chance_%": pct(chance), "target_vs_mark_twins_cos": round(pct(twin_cos) / 100, 4)}
    out = {"split": split, **rates([True] * len(cands))}
    out["by_anchor_size"] = {size: rates([s == size for s in sizes]) for size in sorted(set(sizes))}
    return out


def measure(spec: str, world: Path, split: str) -> dict:
    backbone = create_backbone(spec)
    ret = evaluate_backbone(backbone, world)
    _, paths = held_out_images(world)
    g, p = encode(backbone, paths)
    mean = p.mean(1)  # (N, D)
    return {"backbone": spec, "weights_sha256": getattr(backbone, "weights_sha256", None),
            "caption->image R@1": ret["caption->image R@1"], "image->caption R@1": ret["image->caption R@1"],
            "backbone_val": ret["n"], "cos(global, mean patch)": round(float(F.cosine_similarity(g, mean, dim=-1).mean()), 3),
            "mean patch -> global": linear_map(mean, g), "instances": instance_check(backbone, world, split)}


def table(rows: list[dict]) -> str:
    lines = ["| backbone | caption -> image R@1 | image -> caption R@1 | cos(global, mean patch) | mean patch -> global: "
             "cos, R@1 | target among its mark twins: by global | by box patches | chance | target-twin cos |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, i = r["mean patch -> global"], r["instances"]
        lines.append(f"| `{r['backbone']}` | {r['caption->image R@1']:.1f} | {r['image->caption R@1']:.1f} | "
                     f"{r['cos(global, mean patch)']:.3f} | {m['cos']:.3f}, {m['R@1']:.3f} | "
                     f"{i['by_reference_global_%']:.1f} % | {i['by_box_patches_%']:.1f} % | {i['chance_%']:.1f} % | "
                     f"{i['target_vs_mark_twins_cos']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=Path, required=True, help="a world with the OACIR protocol (foco world oacir)")
    ap.add_argument("--backbone", action="append", required=True, help="a backbone spec; repeat for several")
    ap.add_argument("--split", default="test", choices=["train", "val", "test"], help="the OACIR split checked")
    ap.add_argument("--out", type=Path, required=True, help="JSON of every row; the table goes to stdout")
    a = ap.parse_args()
    rows = [measure(spec, a.world, a.split) for spec in a.backbone]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"world": str(a.world), "rows": rows}, indent=2) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
