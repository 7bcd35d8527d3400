"""`foco adafocal train`: AdaFocal (OACIR) on a world's OACIR split and its cached features."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from .rules import declare
from .common import add_device_arg, add_owned_output, learning_rate, nonneg_int, positive_int, seed_int
from .numbers import float_in
from .resume import add_allow_changed, add_resume_args, start_or_continue
from ..utils.parse import MAX_BOX_BETA

if TYPE_CHECKING:
    from ..train.adafocal import AdaFocalTrainConfig


def train_on_world(features: Path, world: Path, split: str, out: Path, cfg: "AdaFocalTrainConfig",
                   resume: bool) -> None:
    """Builds the quadruples of `world`'s OACIR `split` from `features`/<split>-oacir and trains on them."""
    from ..benchmarks.world import load_world_part
    from ..features import FeatureCache, cache_fingerprint
    from ..train.adafocal import quadruples_from_parts, train_adafocal
    from ..world.oacir import PROTOCOL
    cache = Path(features) / f"{split}-{PROTOCOL}"
    bench, feats = load_world_part(world, split, PROTOCOL, cache)  # its queries carry boxes and instances
    data = quadruples_from_parts(bench, feats)
    fc = FeatureCache(cache)
    meta = {"provenance": {"backbone": feats.backbone, "features": {
        "path": str(cache.resolve()), "fingerprint": cache_fingerprint(fc.manifest),
        **({"source": fc.manifest["source"]} if isinstance(fc.manifest.get("source"), dict) else {})}},
        "data": {"world": str(Path(world).resolve()), "split": split, "quadruples": len(data),
                 "instances": len(set(data.instance_ids))}}
    train_adafocal(data, out, cfg, resume=resume, meta=meta)


def _adafocal_train(a: argparse.Namespace) -> int:
    from ..model.caam import CAAMConfig
    from ..train.adafocal import AdaFocalTrainConfig
    from ..utils.device import resolve_device
    resume = start_or_continue(a)  # --restart clears --out here; a run left in it is continued
    caam = CAAMConfig(probes=a.probes, layers=a.layers, crm=a.crm, learnable_probes=not a.frozen_probes,
                      beta=a.beta)
    cfg = AdaFocalTrainConfig(variant=a.variant, caam=caam, fixed_beta=a.fixed_beta, epochs=a.epochs,
                              batch_size=a.batch_size, lr=a.lr, seed=a.seed, device=str(resolve_device(a.device)),
                              max_steps=a.max_steps, allow_changed=tuple(a.allow_changed))
    train_on_world(Path(a.features), Path(a.world), a.split, Path(a.out), cfg, resume)
    print(f"AdaFocal ({a.variant}) in {a.out}; use it with --methods adafocal --adafocal {a.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    ad = sub.add_parser("adafocal", help="AdaFocal (OACIR, supervised)").add_subparsers(dest="action", required=True)
    p = ad.add_parser("train", help="train AdaFocal on a world's OACIR quadruples and their cached features")
    p.add_argument("--features", required=True, help="folder of feature caches: <split>-oacir is read")
    p.add_argument("--world", required=True, help="the world root (its OACIR benchmark: queries and boxes)")
    p.add_argument("--split", default="train", choices=["train", "val", "test"], help="the OACIR split to train on")
    p.add_argument("--out", required=True, help="output folder (created; rerun the same command to resume)")
    add_owned_output(p, signature=("train_state", "train_log.jsonl", "adafocal.json", "model.safetensors"))
    p.add_argument("--variant", default="caam", choices=["caam", "none", "fixed"],
                   help="caam: AdaFocal (default); none: the baseline without CAAM (the box ignored); fixed: foco's "
                        "fixed beta inside the box (--fixed-beta)")
    p.add_argument("--fixed-beta", type=float_in(-MAX_BOX_BETA, MAX_BOX_BETA), default=0.0,
                   help=f"the fixed variant's beta, within +-{MAX_BOX_BETA:g} (choose it on val)")
    p.add_argument("--probes", type=positive_int, default=8, help="CAAM's probe tokens")
    p.add_argument("--layers", type=nonneg_int, default=2, help="CAAM's self-attention layers")
    p.add_argument("--crm", default="mlp", choices=["mlp", "pool"],
                   help="context reasoning module: mlp (default) or average pooling (ablation)")
    p.add_argument("--frozen-probes", action="store_true", help="fixed random probes, not trained (ablation)")
    p.add_argument("--beta", default="scalar", choices=["scalar", "vector"],
                   help="scalar: one beta per query (default); vector: one per patch in the box (ablation)")
    p.add_argument("--epochs", type=nonneg_int, default=8, help="passes over the training quadruples")
    p.add_argument("--batch-size", type=positive_int, default=128, help="quadruples per step")
    p.add_argument("--lr", type=learning_rate, default=3e-4,
                   help="peak learning rate (linear warm-up, then cosine decay)")
    p.add_argument("--max-steps", type=positive_int, default=None, help="stop after this many steps (smoke tests)")
    p.add_argument("--seed", type=seed_int, default=0, help="random seed (same seed, same result)")
    add_device_arg(p)
    add_resume_args(p)
    add_allow_changed(p)
    p.set_defaults(func=_adafocal_train)
    declare(p, reads={"features": "feature caches", "world": "world"})
