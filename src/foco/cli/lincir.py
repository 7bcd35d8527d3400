"""`foco lincir train`: the LinCIR baseline's phi, on a world's captions alone."""
from __future__ import annotations

import argparse

from .rules import declare
from .common import (add_device_arg, add_distributed_args, add_owned_output, learning_rate, positive_int,
                     run_context, seed_int)
from .resume import add_allow_changed, add_resume_args, start_or_continue


def _lincir_train(a: argparse.Namespace) -> int:
    from ..backbones import create_backbone
    from ..train.distributed import shutdown
    from ..train.lincir import LinCIRTrainConfig, lincir_captions, train_lincir
    from ..world.generate import world_fingerprint
    captions = lincir_captions(a.world, a.split, a.add_decompositions)
    # torchrun ... -m foco lincir: the run's context, made once and passed down
    env = run_context(a)
    resume = start_or_continue(a, env)  # --restart clears --out here; a run left in it is continued
    cfg = LinCIRTrainConfig(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, seed=a.seed, device=env.device,
                            allow_changed=tuple(a.allow_changed))
    backbone = create_backbone(a.backbone, env.device)
    from ..backbones.pseudo import PseudoTokenBackbone
    if not isinstance(backbone, PseudoTokenBackbone):
        raise ValueError(f"--backbone {a.backbone} cannot read pseudo tokens, which LinCIR's phi writes; choose a "
                         "world or CLIP backbone")
    train_lincir(captions, backbone, a.out, cfg, resume=resume,
                 meta={"world": world_fingerprint(a.world), "split": a.split,
                       "added_decompositions": bool(a.add_decompositions)}, ctx=env)
    shutdown(env)
    if env.is_main:
        print(f"LinCIR phi in {a.out} ({len(captions)} captions); use it with "
              f"foco eval --methods lincir --lincir {a.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    lc = sub.add_parser("lincir", help="the LinCIR baseline (language-only training)").add_subparsers(
        dest="action", required=True)
    t = lc.add_parser("train", help="train LinCIR's phi on a world's captions, text alone")
    t.add_argument("--world", required=True, help="world folder (foco world generate --out): its captions train phi")
    t.add_argument("--split", default="train", choices=["pretrain", "train"], help="the captions' pairs split")
    t.add_argument("--backbone", required=True, help="the frozen backbone whose text tower phi writes into "
                                                     "(e.g. world:vit, or the run's foco.json backbone)")
    t.add_argument("--add-decompositions", action="store_true",
                   help="the +AD control: also train on each caption's decomposition pairs, rejoined into sentences "
                        "('{context} with {local}')")
    t.add_argument("--out", required=True, help="output folder (created; rerun the same command to resume)")
    add_owned_output(t, signature=("train_state", "train_log.jsonl"), kind="LinCIR phi")
    t.add_argument("--epochs", type=positive_int, default=20, help="passes over the captions")
    t.add_argument("--batch-size", type=positive_int, default=256, help="captions per step (the reference: 256-512)")
    t.add_argument("--lr", type=learning_rate, default=1e-4, help="learning rate (constant, the reference's)")
    t.add_argument("--seed", type=seed_int, default=0, help="random seed (same seed, same result)")
    add_device_arg(t)
    add_resume_args(t)
    add_distributed_args(t, sync=False)
    add_allow_changed(t)
    t.set_defaults(func=_lincir_train)
    declare(t, reads={"world": "world", "backbone": "backbone"})
