"""`foco pic2word train`: the Pic2Word baseline's mapping network, on cached image features."""
from __future__ import annotations

import argparse

from .rules import declare
from .common import (add_device_arg, add_distributed_args, add_owned_output, learning_rate, nonneg_int, positive_int,
                     run_context, seed_int)
from .resume import add_allow_changed, add_resume_args, start_or_continue


def _pic2word_train(a: argparse.Namespace) -> int:
    from ..backbones import create_backbone
    from ..features import FeatureCache
    from ..methods.pic2word import Pic2WordConfig
    from ..train.pic2word import Pic2WordTrainConfig, train_pic2word
    from ..backbones import check_same_backbone
    from ..train.sources import training_data
    cache = FeatureCache(a.features)
    spec = a.backbone or cache.manifest["backbone"]
    check_same_backbone(spec, "--backbone", cache.backbone, f"the features in {a.features}",
                        f"leave --backbone out (the features' {cache.backbone['spec']}), or extract features with it")
    from ..train.distributed import shutdown
    # torchrun ... -m foco pic2word: the run's context, made once and passed down
    env = run_context(a)
    resume = start_or_continue(a, env)  # --restart clears --out here; a run left in it is continued
    cfg = Pic2WordTrainConfig(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, seed=a.seed, device=env.device,
                              optimizer=a.optimizer, allow_changed=tuple(a.allow_changed),
                              model=Pic2WordConfig(mapper_input=a.mapper_input))
    images = cache.images(patches=False)[1]
    train_pic2word(images.global_, create_backbone(spec, env.device), a.out, cfg, resume=resume,
                   meta={"provenance": training_data(a.features).provenance()}, image_norm=images.norm, ctx=env)
    shutdown(env)
    if env.is_main:
        print(f"Pic2Word mapper in {a.out}; use it with foco eval --methods pic2word --pic2word {a.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    pw = sub.add_parser("pic2word", help="the Pic2Word baseline").add_subparsers(dest="action", required=True)
    pt = pw.add_parser("train", help="train Pic2Word's mapping network on cached image features")
    pt.add_argument("--features", required=True, help="feature cache of the training split (its images)")
    pt.add_argument("--out", required=True, help="output folder (created; rerun the same command to resume)")
    add_owned_output(pt, signature=("train_state", "train_log.jsonl"), kind="Pic2Word mapper")
    pt.add_argument("--backbone", default=None, help="default: the backbone recorded in the feature cache")
    pt.add_argument("--epochs", type=nonneg_int, default=2, help="passes over the training data")
    pt.add_argument("--batch-size", type=positive_int, default=128, help="examples per step")
    pt.add_argument("--lr", type=learning_rate, default=5e-4,
                    help="peak learning rate (linear warm-up, then cosine decay)")
    pt.add_argument("--optimizer", default="reference", choices=["reference", "adamw"],
                    help="reference: Pic2Word's trainer (AdamW, betas 0.9/0.98, eps 1e-6, no decay on biases and "
                         "norms; default); adamw: torch's AdamW defaults with decay on every parameter (foco before)")
    pt.add_argument("--mapper-input", default="raw", choices=["raw", "normalized"],
                    help="raw: the mapper reads the unnormalised image embedding, as Pic2Word's reference does "
                         "(default; needs a cache that keeps the norms); normalized: the L2-normalised one")
    pt.add_argument("--seed", type=seed_int, default=0, help="random seed (same seed, same result)")
    add_device_arg(pt)
    add_resume_args(pt)
    add_allow_changed(pt)
    add_distributed_args(pt, sync=False)
    pt.set_defaults(func=_pic2word_train)
    declare(pt, reads={"features": "feature cache", "backbone": "backbone"})
