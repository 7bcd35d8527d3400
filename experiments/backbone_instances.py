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
  is 4-6 pixels, a large one's about 12: whether the marks are legible to 8 x 8 patches);
* the mark words: a zero-shot check of whether the backbone ties a mark's name to its picture. A seeded draw of
  one-shape scenes (120 small, 120 large; random kind, colour, mark, cell and background) is each ranked against
  the six captions "a photo showing a <size> <colour> <kind> with <mark>" that differ only in the mark; chance is
  1 / 6. Beside it, which side fails: a linear probe of the mark on the image globals (ridge, lambda 1, fitted on
  1,200 other such shapes a size, none a tested picture), and the mean cosine between those six captions' text
  features (1.0: the text tower does not tell the mark words apart).

    python experiments/backbone_instances.py --world runs/w100k/world --split test \
        --backbone world:vit --backbone world:runs/w100k/backbone --out runs/w100k/instances-test.json
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


def mark_words(backbone, per_size: int = 120, seed: int = 0, probe_extra: int = 1200) -> dict:
    """Zero-shot mark classification of rendered one-shape scenes, by the shape's size (module docstring); beside
    it, whether the image features hold the mark at all (a linear probe fitted on `probe_extra` other shapes), and
    how far apart the text tower puts the six captions that differ only in the mark (their mean cosine)."""
    import numpy as np
    from foco.world.captions import object_phrase
    from foco.world.render import render_scene
    from foco.world.scene import Scene, WorldObject
    from foco.world.vocab import BACKGROUNDS, COLOURS, MARKS, SHAPES
    rng = np.random.default_rng(seed)
    out, probe, text_cos = {}, {}, []
    for size in ("small", "large"):
        hits, feats, labels, tested = 0, [], [], set()
        while len(feats) < per_size + probe_extra:
            k = len(feats)
            kind, colour = str(rng.choice(SHAPES)), str(rng.choice(list(COLOURS)))
            mark, bg, cell = str(rng.choice(MARKS)), str(rng.choice(list(BACKGROUNDS))), int(rng.integers(4))
            if k >= per_size and (kind, colour, mark, bg, cell) in tested:
                continue  # a training shape never repeats a tested picture (rendering is deterministic)
            tested.add((kind, colour, mark, bg, cell)) if k < per_size else None
            image = render_scene(Scene(bg, (WorldObject(kind, colour, size, cell, (0, 0), mark=mark),)))
            with torch.no_grad():
                g = backbone.encode_images([image]).global_[0]  # (D,)
            feats.append(F.normalize(g.float(), dim=-1))
            labels.append(MARKS.index(mark))
            if k >= per_size:  # the linear probe's extra training shapes
                continue
            texts = [f"a photo showing {object_phrase(WorldObject(kind, colour, size, 0, mark=m), True)}" for m in MARKS]
            with torch.no_grad():
                t = F.normalize(backbone.encode_texts(texts).global_.float(), dim=-1)  # (6, D)
            hits += int((t @ g.float()).argmax() == MARKS.index(mark))
            text_cos.append(float((t @ t.t()).sum() - len(MARKS)) / (len(MARKS) * (len(MARKS) - 1)))
        out[size] = round(100 * hits / per_size, 1)
        # a linear probe (ridge on one-hot marks) fitted on the extra shapes, tested on the first per_size
        x, y = torch.stack(feats), torch.tensor(labels)  # (n, D), (n,)
        xa = torch.cat([x, torch.ones(len(x), 1)], 1).double()
        xt = xa[per_size:]  # ridge (lambda 1) on one-hot targets
        w = torch.linalg.solve(xt.t() @ xt + torch.eye(xt.shape[1], dtype=xt.dtype),
                               xt.t() @ F.one_hot(y[per_size:], len(MARKS)).double())
        probe[size] = round(100 * float(((xa[:per_size] @ w).argmax(-1) == y[:per_size]).float().mean()), 1)
    return {"shapes_per_size": per_size, "chance_%": round(100 / len(MARKS), 1), "accuracy_%": out,
            "linear_probe_%": probe, "probe_train_shapes": probe_extra,
            "mark_captions_text_cos": round(sum(text_cos) / len(text_cos), 4)}


def measure(spec: str, world: Path, split: str) -> dict:
    backbone = create_backbone(spec)
    ret = evaluate_backbone(backbone, world)
    _, paths = held_out_images(world)
    g, p = encode(backbone, paths)
    mean = p.mean(1)  # (N, D)
    return {"backbone": spec, "weights_sha256": getattr(backbone, "weights_sha256", None),
            "caption->image R@1": ret["caption->image R@1"], "image->caption R@1": ret["image->caption R@1"],
            "backbone_val": ret["n"], "cos(global, mean patch)": round(float(F.cosine_similarity(g, mean, dim=-1).mean()), 3),
            "mean patch -> global": linear_map(mean, g), "instances": instance_check(backbone, world, split),
            "mark_words": mark_words(backbone)}


def table(rows: list[dict]) -> str:
    lines = ["| backbone | caption -> image R@1 | image -> caption R@1 | cos(global, mean patch) | mean patch -> global: "
             "cos, R@1 | target among its mark twins: by global | by box patches | chance | target-twin cos | "
             "mark words: small, large (chance 16.7) | linear probe: small, large | mark captions' text cos |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, i, w = r["mean patch -> global"], r["instances"], r["mark_words"]["accuracy_%"]
        pr = r["mark_words"]["linear_probe_%"]
        lines.append(f"| `{r['backbone']}` | {r['caption->image R@1']:.1f} | {r['image->caption R@1']:.1f} | "
                     f"{r['cos(global, mean patch)']:.3f} | {m['cos']:.3f}, {m['R@1']:.3f} | "
                     f"{i['by_reference_global_%']:.1f} % | {i['by_box_patches_%']:.1f} % | {i['chance_%']:.1f} % | "
                     f"{i['target_vs_mark_twins_cos']:.3f} | {w['small']:.1f} %, {w['large']:.1f} % | "
                     f"{pr['small']:.1f} %, {pr['large']:.1f} % | {r['mark_words']['mark_captions_text_cos']:.3f} |")
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
