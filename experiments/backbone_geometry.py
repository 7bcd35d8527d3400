"""Where FoCo's image shortcut can live, measured on a backbone before FoCo is trained on it (issue 39).

On held-out images of a world (the `val` and `test` galleries of the `single` protocol, which no backbone trained on),
for each backbone:

* cos(global, mean patch): the cosine between an image's global feature and the mean of its patch features;
* a least-squares linear map with bias from the mean patch to the global, fitted on 70 % of the images (a seeded
  split) and tested on the other 30 %: the mean cosine of its prediction to the true global, and R@1 of the
  prediction retrieving its own image's global among the held-out globals;
* with --checkpoint: the same two figures with the background feature of that checkpoint's trained F_Aggr in place
  of the mean patch (F_Aggr queried with each val/test query's own modification text, the background mapped to the
  reference's global; the split is over references, so no held-out reference was fitted), and the mean patch's map
  again on those same queries and split, so that the two R@1 are read against one gallery.

    python experiments/backbone_geometry.py --world runs/quickstart/world --backbone world:pretrained \
        --checkpoint runs/quickstart/foco --out runs/geometry/cnn.json
    python experiments/backbone_geometry.py --world runs/quickstart/world --backbone world:vit --out runs/geometry/vit.json
    python experiments/backbone_geometry.py --world runs/quickstart/world --vit-init 0 --out runs/geometry/vit-init.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from foco.utils.io import iter_batches, load_image
from foco.world.manifest import load_benchmark


def held_out_images(world: Path) -> tuple[list[str], list[str]]:
    """Ids and paths of the val and test galleries (single protocol), each image once."""
    seen: dict[str, str] = {}
    for split in ("val", "test"):
        bench = load_benchmark(world, split, "single")
        for g, p in zip(bench.gallery_ids, bench.gallery_images):
            seen.setdefault(g, p)
    ids = sorted(seen)
    return ids, [seen[i] for i in ids]


def encode(backbone, paths: list[str], batch_size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    g, p = [], []
    for batch in iter_batches(paths, batch_size):
        f = backbone.encode_images([load_image(x) for x in batch])
        g.append(f.global_)
        p.append(f.patches)
    return torch.cat(g), torch.cat(p)  # (N, D) normalised, (N, P, D)


def linear_map(x: torch.Tensor, y: torch.Tensor, groups: np.ndarray | None = None, seed: int = 0,
               frac: float = 0.7) -> dict[str, float]:
    """Least squares with bias from x (N, D) to y (N, D) on a seeded 70 % of the groups (default: the rows), tested
    on the rest: the mean cosine of prediction to truth, and R@1 of each prediction among the held-out truths
    (truths of one group counted once: the target is its own group's row)."""
    groups = np.arange(len(x)) if groups is None else groups
    uniq = np.unique(groups)
    perm = np.random.default_rng(seed).permutation(len(uniq))
    fit_groups = set(uniq[perm[: int(round(frac * len(uniq)))]].tolist())
    fit = torch.tensor([g in fit_groups for g in groups])
    xa = torch.cat([x, torch.ones(len(x), 1)], 1).double()  # (N, D + 1)
    w = torch.linalg.lstsq(xa[fit], y[fit].double()).solution  # (D + 1, D)
    pred = F.normalize((xa[~fit] @ w).float(), dim=-1)  # (n, D)
    truth = F.normalize(y[~fit], dim=-1)  # (n, D)
    test_groups = groups[(~fit).numpy()]
    uniq_test, first = np.unique(test_groups, return_index=True)
    gallery = truth[torch.from_numpy(first)]  # (G, D) one row per held-out group
    own = torch.from_numpy(np.searchsorted(uniq_test, test_groups))  # (n,)
    top = (pred @ gallery.t()).argmax(-1)  # (n,)
    return {"cos": round(float((pred * truth).sum(-1).mean()), 3), "R@1": round(float((top == own).float().mean()), 3),
            "fit": int(fit.sum()), "held_out": int((~fit).sum()), "held_out_gallery": len(uniq_test)}


def background_rows(world: Path, features: Path, checkpoint: Path
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray]:
    """F_Aggr's background (Q, D) for every val and test single query with its own text, the reference's global
    (Q, D) and mean patch (Q, D), and the reference ids as groups."""
    from foco.benchmarks.world import load_world_part
    from foco.model.encoder import ComposedQueryEncoder
    from foco.eval.compose import reference_rows
    model = ComposedQueryEncoder.load(checkpoint)
    bg, ref, mean, groups = [], [], [], []
    for split in ("val", "test"):
        bench, feats = load_world_part(world, split, "single", features / f"{split}-single")
        rows = reference_rows(bench, feats)
        text_pos = {t: i for i, t in enumerate(feats.text_ids)}
        trows = torch.tensor([text_pos[q.texts[0]] for q in bench.queries])
        with torch.inference_mode():
            for s in range(0, len(rows), 256):
                r, t = rows[s:s + 256], trows[s:s + 256]
                text = feats.texts.take(t)
                _, b, _ = model.aggr(text.global_[:, None, :], feats.references.global_[r],
                                     feats.references.patches[r])  # (b, 1, D)
                bg.append(b[:, 0].float())
                ref.append(feats.references.global_[r].float())
                mean.append(feats.references.patches[r].float().mean(1))
        groups += [f"{split}/{q.reference}" for q in bench.queries]
    return torch.cat(bg), torch.cat(ref), torch.cat(mean), np.array(groups)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", required=True)
    ap.add_argument("--backbone", default=None, help="a backbone spec, e.g. world:vit")
    ap.add_argument("--vit-init", type=int, default=None, metavar="SEED",
                    help="instead of --backbone: the world ViT at its initialisation with this seed")
    ap.add_argument("--checkpoint", default=None, help="a FoCo checkpoint trained on this backbone's features")
    ap.add_argument("--features", default=None, help="that checkpoint's feature folder (val-single, test-single)")
    ap.add_argument("--seed", type=int, default=0, help="the 70/30 split's seed")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    world = Path(a.world)
    if a.vit_init is not None:
        from foco.backbones.world import WorldBackbone, WorldBackboneConfig, WorldCLIP, load_world_backbone
        torch.manual_seed(a.vit_init)
        trained = load_world_backbone("vit")  # the same shape as the shipped ViT
        backbone = WorldBackbone(WorldCLIP(WorldBackboneConfig(**vars(trained.cfg))), None)
        name = f"world ViT at initialisation (seed {a.vit_init})"
    else:
        from foco.backbones import create_backbone
        backbone = create_backbone(a.backbone)
        name = a.backbone
    ids, paths = held_out_images(world)
    g, p = encode(backbone, paths)
    mean = p.mean(1)  # (N, D)
    out = {"backbone": name, "images": len(ids),
           "cos(global, mean patch)": round(float(F.cosine_similarity(g, mean, dim=-1).mean()), 3),
           "mean patch -> global": linear_map(mean, g, seed=a.seed)}
    if a.checkpoint:
        bg, ref, mp, groups = background_rows(world, Path(a.features), Path(a.checkpoint))
        out["checkpoint"] = a.checkpoint
        out["queries"] = len(groups)
        out["cos(global, background)"] = round(float(F.cosine_similarity(ref, bg, dim=-1).mean()), 3)
        out["background -> global"] = linear_map(bg, ref, groups, seed=a.seed)
        # the mean patch on the very same queries and split, so that the two R@1 share a gallery
        out["mean patch -> global, same queries"] = linear_map(mp, ref, groups, seed=a.seed)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
