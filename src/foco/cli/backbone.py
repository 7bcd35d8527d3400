"""`foco backbone train | eval`: the world backbone, and caption <-> image retrieval of any backbone."""
from __future__ import annotations

import argparse
from pathlib import Path

from .rules import declare
from .common import (add_device_arg, add_owned_output, add_precision_arg, learning_rate, nonneg_int, positive_int,
                     print_table, seed_int)
from .resume import add_allow_changed, add_resume_args, start_or_continue


def _train(a: argparse.Namespace) -> int:
    from ..backbones.world import WorldBackboneConfig
    from ..train.world_backbone import BackboneTrainConfig, train_world_backbone
    model = WorldBackboneConfig(image_tower=a.image_tower, vit_width=a.vit_width, vit_layers=a.vit_layers,
                                vit_heads=a.vit_heads, patch_size=a.patch_size)
    cfg = BackboneTrainConfig(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, seed=a.seed, threads=a.threads,
                              device=a.device, allow_changed=tuple(a.allow_changed), model=model,
                              precision=a.precision)
    metrics = train_world_backbone(a.world, a.out, cfg, resume=start_or_continue(a))
    print_table("world backbone on backbone_val", metrics)
    print(f"saved to {a.out} (model.safetensors + config.json); use it as --backbone world:{a.out}")
    return 0


def _eval(a: argparse.Namespace) -> int:
    from ..backbones import create_backbone
    from ..train.world_backbone import evaluate_backbone
    from ..utils.device import resolve_device
    backbone = create_backbone(a.backbone, device=str(resolve_device(a.device)))
    print_table(f"{a.backbone} on {a.split}", evaluate_backbone(backbone, Path(a.world), a.split))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    bb = sub.add_parser("backbone", help="the world backbone").add_subparsers(dest="action", required=True)
    t = bb.add_parser("train", help="pretrain the world backbone contrastively on the pretrain split")
    t.add_argument("--world", required=True, help="world folder (foco world generate --out)")
    t.add_argument("--out", required=True, help="output folder (created; rerun the same command to resume)")
    add_owned_output(t, signature=("train_state", "train_log.jsonl"), kind="world backbone")
    t.add_argument("--epochs", type=nonneg_int, default=6, help="passes over the training data")
    t.add_argument("--batch-size", type=positive_int, default=256, help="examples per step")
    t.add_argument("--lr", type=learning_rate, default=2e-3,
                   help="peak learning rate (linear warm-up, then cosine decay)")
    t.add_argument("--seed", type=seed_int, default=0, help="random seed (same seed, same result)")
    t.add_argument("--threads", type=positive_int, default=None, help="torch CPU threads (default: torch's choice)")
    add_resume_args(t)
    t.add_argument("--image-tower", choices=("cnn", "vit"), default="cnn",
                   help="cnn: the residual CNN with an attention pool (world:pretrained); vit: transformers' "
                        "CLIPVisionModelWithProjection, read as foco reads CLIP ViT (world:vit)")
    t.add_argument("--vit-width", type=positive_int, default=192, help="vit: transformer width")
    t.add_argument("--vit-layers", type=positive_int, default=4, help="vit: transformer layers")
    t.add_argument("--vit-heads", type=positive_int, default=4, help="vit: attention heads (must divide the width)")
    t.add_argument("--patch-size", type=positive_int, default=8, help="vit: pixels per patch side (divides 64)")
    add_device_arg(t)
    add_precision_arg(t)
    add_allow_changed(t)
    t.set_defaults(func=_train)
    declare(t, reads={"world": "world"})
    e = bb.add_parser("eval", help="caption<->image retrieval of a backbone on a pairs split")
    e.add_argument("--backbone", required=True, help="e.g. world:runs/backbone or hf:PATH")
    e.add_argument("--world", required=True, help="world folder (foco world generate --out)")
    e.add_argument("--split", default="backbone_val", help="which split to read")
    add_device_arg(e)
    e.set_defaults(func=_eval)
    declare(e, reads={"world": "world", "backbone": "backbone"}, values=("split",))
