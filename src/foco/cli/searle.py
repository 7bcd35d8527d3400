"""`foco searle oti` and `foco searle train`: SEARLE's textual inversion of cached images, then its phi."""
from __future__ import annotations

import argparse

from .rules import declare
from .common import add_device_arg, add_owned_output, learning_rate, nonneg_int, positive_int, seed_int
from .resume import add_allow_changed, add_resume_args, start_or_continue


def _cache_and_backbone(features: str, backbone: str | None, device: str):
    from ..backbones import check_same_backbone, create_backbone
    from ..backbones.pseudo import PseudoTokenBackbone
    from ..features import FeatureCache
    cache = FeatureCache(features)
    spec = backbone or cache.manifest["backbone"]
    check_same_backbone(spec, "--backbone", cache.backbone, f"the features in {features}",
                        f"leave --backbone out (the features' {cache.backbone['spec']}), or extract features with it")
    bb = create_backbone(spec, device)
    if not isinstance(bb, PseudoTokenBackbone):
        raise ValueError(f"--backbone {spec} cannot read pseudo tokens, which SEARLE inverts into; choose a world or "
                         "CLIP backbone")
    images = cache.images(patches=False)[1]
    if images.norm is None:
        raise ValueError(f"{features} has no norms of the raw image embeddings, which SEARLE's phi reads: extract "
                         "the features again with this foco (`foco features extract` keeps them)")
    return bb, images


def _oti(a: argparse.Namespace) -> int:
    from ..train.searle import OTIConfig, run_oti
    from ..train.sources import training_data
    from ..world.phrases import concept_phrases, world_concepts
    from ..utils.device import resolve_device
    device = str(resolve_device(a.device))
    start_or_continue(a)
    bb, images = _cache_and_backbone(a.features, a.backbone, device)
    cfg = OTIConfig(steps=a.oti_steps, batch_size=a.batch_size, lr=a.lr, top_k=a.top_k, images=a.images,
                    phrase_seed=a.phrase_seed, seed=a.seed, device=device)
    concepts = world_concepts()
    rec = run_oti(images.global_, bb, concepts, concept_phrases(concepts, seed=a.phrase_seed), a.out, cfg,
                  resume=True, meta={"provenance": training_data(a.features).provenance()})
    print(f"OTI tokens of {rec['images']} images in {a.out}; distil phi with foco searle train --features "
          f"{a.features} --oti {a.out} --out DIR")
    return 0


def _train(a: argparse.Namespace) -> int:
    from ..train.searle import SEARLETrainConfig, read_oti, train_searle
    from ..train.sources import training_data
    from ..utils.device import resolve_device
    device = str(resolve_device(a.device))
    oti = read_oti(a.oti)
    provenance = training_data(a.features).provenance()
    if oti[0].get("provenance") not in (None, provenance):
        raise ValueError(f"--oti {a.oti} inverted the images of other features than --features {a.features}; give "
                         "the feature cache OTI ran on")
    resume = start_or_continue(a)
    bb, images = _cache_and_backbone(a.features, a.backbone or oti[0]["backbone"], device)
    cfg = SEARLETrainConfig(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, top_k=a.top_k, seed=a.seed,
                            device=device, allow_changed=tuple(a.allow_changed))
    train_searle(images.global_ * images.norm[:, None], oti, bb, a.out, cfg, resume=resume,
                 meta={"provenance": provenance, "oti": str(a.oti)})
    print(f"SEARLE phi in {a.out}; use it with foco eval --methods searle --searle {a.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    sg = sub.add_parser("searle", help="the SEARLE-XL baseline (textual inversion, then phi distilled from it)"
                        ).add_subparsers(dest="action", required=True)
    o = sg.add_parser("oti", help="optimisation-based textual inversion of cached images (stage 1)")
    o.add_argument("--features", required=True, help="feature cache of the training split (its images)")
    o.add_argument("--backbone", default=None, help="default: the backbone recorded in the feature cache")
    o.add_argument("--out", required=True, help="output folder (created; rerun the same command to resume)")
    add_owned_output(o, signature=(".oti-progress.json",), kind="SEARLE OTI tokens")
    o.add_argument("--images", type=positive_int, default=None,
                   help="invert this many images of the cache, a seeded sample (default: all)")
    o.add_argument("--oti-steps", type=positive_int, default=350, help="optimisation steps per image (the reference's)")
    o.add_argument("--batch-size", type=positive_int, default=32, help="images inverted together (the reference's)")
    o.add_argument("--lr", type=learning_rate, default=2e-2, help="AdamW's learning rate (the reference's 2e-2)")
    o.add_argument("--top-k", type=positive_int, default=15,
                   help="concepts per image whose phrases regularise its token (the reference's 15)")
    o.add_argument("--phrase-seed", type=seed_int, default=0, help="seed of the world's concept phrases")
    o.add_argument("--seed", type=seed_int, default=0, help="random seed (same seed, same tokens)")
    add_device_arg(o)
    add_resume_args(o)
    o.set_defaults(func=_oti)
    declare(o, reads={"features": "feature cache", "backbone": "backbone"})

    t = sg.add_parser("train", help="distil SEARLE's phi from OTI tokens (stage 2)")
    t.add_argument("--features", required=True, help="the feature cache `foco searle oti` inverted")
    t.add_argument("--oti", required=True, help="a finished folder of `foco searle oti`")
    t.add_argument("--backbone", default=None, help="default: the backbone OTI ran with")
    t.add_argument("--out", required=True, help="output folder (created; rerun the same command to resume)")
    add_owned_output(t, signature=("train_state", "train_log.jsonl"), kind="SEARLE phi")
    t.add_argument("--epochs", type=nonneg_int, default=100, help="passes over the inverted images (the reference's)")
    t.add_argument("--batch-size", type=positive_int, default=256, help="images per step (the reference's)")
    t.add_argument("--lr", type=learning_rate, default=1e-4, help="AdamW's learning rate, constant (the reference's)")
    t.add_argument("--top-k", type=positive_int, default=150,
                   help="concepts per image a phrase is drawn from (the reference's --top-k-concepts)")
    t.add_argument("--seed", type=seed_int, default=0, help="random seed (same seed, same result)")
    add_device_arg(t)
    add_resume_args(t)
    add_allow_changed(t)
    t.set_defaults(func=_train)
    declare(t, reads={"features": "feature cache", "oti": "weights", "backbone": "backbone"})
