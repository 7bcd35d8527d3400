"""`foco tat train`: SlerpTAT's text-anchored tuning of a backbone's image tower, on a world's image-caption pairs."""
from __future__ import annotations

import argparse

from .rules import declare
from .common import (add_device_arg, add_owned_output, add_precision_arg, float_in, learning_rate, lora_alpha,
                     nonneg_int, positive_int, seed_int)
from .resume import add_allow_changed, add_resume_args, start_or_continue


def _tat_train(a: argparse.Namespace) -> int:
    from ..train.tat import TATTrainConfig, train_tat
    from ..world.generate import world_fingerprint
    from ..world.manifest import load_pairs
    targets = tuple(t.strip() for t in a.lora_targets.split(",") if t.strip())
    if not targets:
        raise ValueError(f"--lora-targets {a.lora_targets!r} names no layer; e.g. q_proj,v_proj")
    pairs = load_pairs(a.world, a.split)
    cfg = TATTrainConfig(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, rank=a.lora_rank, alpha=a.lora_alpha,
                         dropout=a.lora_dropout, targets=targets, weight_decay=a.weight_decay,
                         warmup_frac=a.warmup_frac,
                         logit_scale=a.logit_scale, workers=a.workers, seed=a.seed, device=a.device,
                         precision=a.precision, allow_changed=tuple(a.allow_changed))
    rec = train_tat(a.backbone, [p.image for p in pairs], [p.caption for p in pairs], a.out, cfg,
                    resume=start_or_continue(a), meta={"world": world_fingerprint(a.world), "split": a.split})
    print(f"TAT adapters in {a.out} ({rec['lora']['parameters']:,} parameters on {rec['lora']['layers']} layers of "
          f"{a.backbone}'s image tower, {len(pairs)} pairs); extract features with --backbone tat:{a.out} and "
          f"evaluate with foco eval --methods slerp-tat --tat {a.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    tg = sub.add_parser("tat", help="SlerpTAT's text-anchored tuning of the image tower").add_subparsers(
        dest="action", required=True)
    t = tg.add_parser("train", help="tune a backbone's image tower with LoRA toward its frozen text tower, on a "
                                    "world's image-caption pairs (the tuned backbone is tat:OUT)")
    t.add_argument("--world", required=True, help="world folder (foco world generate --out): its pairs train")
    t.add_argument("--split", default="train", choices=["pretrain", "train"], help="the pairs split")
    t.add_argument("--backbone", required=True, help="the backbone whose image tower is tuned (a ViT: world:vit, "
                                                     "hf:PATH of a CLIP or SigLIP)")
    t.add_argument("--out", required=True, help="output folder (created; rerun the same command to resume)")
    add_owned_output(t, signature=("train_state", "train_log.jsonl"), kind="TAT adapters")
    t.add_argument("--epochs", type=nonneg_int, default=1, help="passes over the pairs (the paper: 1, on 2M pairs)")
    t.add_argument("--batch-size", type=positive_int, default=1024, help="pairs per step (the paper's 1024)")
    t.add_argument("--lr", type=learning_rate, default=1e-4,
                   help="peak learning rate (the paper's 1e-4; linear warm-up, then cosine decay)")
    t.add_argument("--weight-decay", type=float_in(0.0, 1.0), default=0.0, help="AdamW's (not in the paper; 0)")
    t.add_argument("--warmup-frac", type=float_in(0.0, 1.0), default=0.05,
                   help="share of the steps with a linear warm-up, then cosine decay (not in the paper)")
    t.add_argument("--lora-rank", type=positive_int, default=16, help="LoRA rank r (the paper's 16)")
    t.add_argument("--lora-alpha", type=lora_alpha, default=16.0, help="LoRA alpha; the update is scaled alpha / r")
    t.add_argument("--lora-dropout", type=float_in(0.0, 0.9), default=0.1,
                   help="dropout on the adapters' input (the paper's 0.1)")
    t.add_argument("--lora-targets", default="q_proj,v_proj",
                   help="comma-separated names of the image tower's Linear layers that get adapters")
    t.add_argument("--logit-scale", type=float_in(0.01, 100.0), default=1 / 0.07,
                   help="the loss's fixed logit scale (the paper's 1 / 0.07)")
    t.add_argument("--workers", type=nonneg_int, default=2,
                   help="DataLoader processes reading and preprocessing images ahead of the steps (0: in the step)")
    t.add_argument("--seed", type=seed_int, default=0, help="random seed (same seed, same result)")
    add_device_arg(t)
    add_precision_arg(t)
    add_resume_args(t)
    add_allow_changed(t)
    t.set_defaults(func=_tat_train)
    declare(t, reads={"world": "world", "backbone": "backbone"}, values=("lora_targets",))
