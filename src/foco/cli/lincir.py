"""`foco lincir train`: the LinCIR baseline's phi, on a world's captions alone."""
from __future__ import annotations

import argparse

from .common import add_allow_changed, add_device_arg, add_owned_output, nonneg_int, positive_float, positive_int


def _lincir_train(a: argparse.Namespace) -> int:
    from ..backbones import create_backbone
    from ..train.lincir import LinCIRTrainConfig, train_lincir
    from ..world.manifest import load_pairs
    from ..world.generate import world_fingerprint
    pairs = load_pairs(a.world, a.split)
    captions = [p.caption for p in pairs]
    if a.add_decompositions:  # the +AD control: each pair of the oracle decomposition, rejoined, as an extra caption
        from ..train.lincir import rejoin
        captions += [rejoin(pair.local, pair.context) for p in pairs for pair in p.decomposition.pairs]
    cfg = LinCIRTrainConfig(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, seed=a.seed, device=a.device,
                            allow_changed=tuple(a.allow_changed))
    backbone = create_backbone(a.backbone)
    if not hasattr(backbone, "encode_texts_with_tokens"):
        raise ValueError(f"--backbone {a.backbone} cannot read pseudo tokens, which LinCIR's phi writes; choose a "
                         "world or CLIP backbone")
    train_lincir(captions, backbone, a.out, cfg, resume=a.resume,
                 meta={"world": world_fingerprint(a.world), "split": a.split,
                       "added_decompositions": bool(a.add_decompositions)})
    print(f"LinCIR phi in {a.out} ({len(captions)} captions); use it with foco eval --methods lincir --lincir {a.out}")
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
    t.add_argument("--out", required=True, help="output folder")
    add_owned_output(t, signature=("train_state", "lincir.json:model"))
    t.add_argument("--resume", action="store_true", help="continue an interrupted run in --out")
    t.add_argument("--epochs", type=nonneg_int, default=20, help="passes over the captions")
    t.add_argument("--batch-size", type=positive_int, default=256, help="captions per step (the reference: 256-512)")
    t.add_argument("--lr", type=positive_float, default=1e-4, help="learning rate (constant, the reference's)")
    t.add_argument("--seed", type=int, default=0, help="random seed (same seed, same result)")
    add_device_arg(t)
    add_allow_changed(t)
    t.set_defaults(func=_lincir_train)
