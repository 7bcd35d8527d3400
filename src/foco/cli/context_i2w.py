"""`foco context-i2w train`: the Context-I2W baseline's mapper, on cached image tokens and a world's captions."""
from __future__ import annotations

import argparse

from .rules import declare
from .common import (add_device_arg, add_distributed_args, add_owned_output, learning_rate, nonneg_int, positive_int,
                     run_context, seed_int)
from .resume import add_allow_changed, add_resume_args, start_or_continue


def _train(a: argparse.Namespace) -> int:
    from ..backbones import check_same_backbone, create_backbone
    from ..features import FeatureCache
    from ..train.context_i2w import ContextI2WTrainConfig, context_pairs, train_context_i2w
    from ..train.distributed import shutdown
    from ..train.sources import training_data
    from ..world.generate import world_fingerprint
    cache = FeatureCache(a.features)
    spec = a.backbone or cache.manifest["backbone"]
    check_same_backbone(spec, "--backbone", cache.backbone, f"the features in {a.features}",
                        f"leave --backbone out (the features' {cache.backbone['spec']}), or extract features with it")
    ids, contexts = context_pairs(a.world, a.split, a.add_decompositions)
    env = run_context(a)
    resume = start_or_continue(a, env)  # --restart clears --out here; a run left in it is continued
    cfg = ContextI2WTrainConfig(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, warmup_steps=a.warmup_steps,
                                seed=a.seed, device=env.device, allow_changed=tuple(a.allow_changed))
    cache_ids, images = cache.images(dtype=None, patches=True)
    train_context_i2w(cache_ids, images, ids, contexts, create_backbone(spec, env.device), a.out, cfg, resume=resume,
                      meta={"provenance": training_data(a.features).provenance(), "world": world_fingerprint(a.world),
                            "split": a.split, "added_decompositions": bool(a.add_decompositions)}, ctx=env)
    shutdown(env)
    if env.is_main:
        print(f"Context-I2W mapper in {a.out} ({len(contexts)} pairs); use it with "
              f"foco eval --methods context-i2w --context-i2w {a.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    cg = sub.add_parser("context-i2w", help="the Context-I2W baseline (context-dependent pseudo words)"
                        ).add_subparsers(dest="action", required=True)
    t = cg.add_parser("train", help="train Context-I2W's mapper on cached image tokens and a world's captions")
    t.add_argument("--features", required=True, help="feature cache of the training split (globals and patches)")
    t.add_argument("--world", required=True, help="the world whose captions, subject masked, are the contexts")
    t.add_argument("--split", default="train", choices=["pretrain", "train"], help="the captions' pairs split")
    t.add_argument("--add-decompositions", action="store_true",
                   help="the +AD control: each caption's decomposition pairs, rejoined into sentences, are extra "
                        "training pairs of the same image")
    t.add_argument("--backbone", default=None, help="default: the backbone recorded in the feature cache")
    t.add_argument("--out", required=True, help="output folder (created; rerun the same command to resume)")
    add_owned_output(t, signature=("train_state", "train_log.jsonl"), kind="Context-I2W mapper")
    t.add_argument("--epochs", type=nonneg_int, default=32, help="passes over the pairs (the reference's 32)")
    t.add_argument("--batch-size", type=positive_int, default=64, help="pairs per step (the reference's 64)")
    t.add_argument("--lr", type=learning_rate, default=5e-4, help="peak learning rate (the reference's for ViT-L/14)")
    t.add_argument("--warmup-steps", type=nonneg_int, default=10000,
                   help="linear warm-up steps, then cosine to 0 (the reference's 10,000)")
    t.add_argument("--seed", type=seed_int, default=0, help="random seed (same seed, same result)")
    add_device_arg(t)
    add_resume_args(t)
    add_allow_changed(t)
    add_distributed_args(t, sync=False)
    t.set_defaults(func=_train)
    declare(t, reads={"features": "feature cache", "world": "world", "backbone": "backbone"})
