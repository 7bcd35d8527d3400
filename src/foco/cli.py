"""The `foco` command line: one subcommand per pipeline stage. Parse -> typed config -> call the library."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path


def _world_generate(a: argparse.Namespace) -> int:
    from .world.generate import generate_world, world_config
    cfg = world_config(a.size, seed=a.seed, stamps_dir=a.stamps)
    out = Path(a.out)
    t0 = time.time()
    summary = generate_world(out, cfg)
    print(f"world written to {out} in {time.time() - t0:.1f}s")
    for name, n in summary["counts"].items():
        print(f"  {name}: {n}")
    return 0


def _world_verify(a: argparse.Namespace) -> int:
    from .world.verify import verify_world
    report = verify_world(a.world)
    print(json.dumps(report, indent=2))
    return 0


def _backbone_train(a: argparse.Namespace) -> int:
    from .backbones.train_world import BackboneTrainConfig, train_world_backbone
    cfg = BackboneTrainConfig(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, seed=a.seed, threads=a.threads)
    metrics = train_world_backbone(a.world, a.out, cfg, resume=not a.no_resume)
    _print_table("world backbone on backbone_val", metrics)
    print(f"saved to {a.out} (model.safetensors + config.json); use it as --backbone world:{a.out}")
    return 0


def _backbone_eval(a: argparse.Namespace) -> int:
    from .backbones import create_backbone
    from .backbones.train_world import evaluate_backbone
    metrics = evaluate_backbone(create_backbone(a.backbone), Path(a.world), a.split)
    _print_table(f"{a.backbone} on {a.split}", metrics)
    return 0


def _features_extract(a: argparse.Namespace) -> int:
    from .backbones import create_backbone
    from .features import ExtractConfig
    from .world.splits import extract_world_split
    cfg = ExtractConfig(shard_size=a.shard_size, batch_size=a.batch_size, dtype=a.dtype, patches=not a.no_patches)
    stats = extract_world_split(create_backbone(a.backbone), a.world, a.split, a.out, cfg)
    for kind, s in stats.items():
        rate = f"{s['encoded'] / s['seconds']:.1f}/s" if s["encoded"] else "all cached"
        print(f"{kind}: {s['items']} items, {s['encoded']} encoded now ({rate})")
    print(f"features in {a.out}")
    return 0


def _print_table(title: str, metrics: dict) -> None:
    print(f"\n| {title} | value |\n|---|---|")
    for k, v in metrics.items():
        print(f"| {k} | {v:.2f} |" if isinstance(v, float) else f"| {k} | {v} |")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="foco", description="Focus-then-Complete zero-shot composed image retrieval")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", required=True)

    world = sub.add_parser("world", help="the embedded synthetic world").add_subparsers(dest="action", required=True)
    g = world.add_parser("generate", help="generate images, caption pairs and CIR benchmarks")
    g.add_argument("--out", required=True, help="output folder")
    g.add_argument("--size", default="default", choices=["tiny", "default"])
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--stamps", default=None,
                   help="folder of captioned cutout PNGs (tuxpaint-stamps layout) to use as extra objects")
    g.set_defaults(func=_world_generate)
    v = world.add_parser("verify", help="check every manifest and image of a world folder")
    v.add_argument("world")
    v.set_defaults(func=_world_verify)

    bb = sub.add_parser("backbone", help="the world backbone").add_subparsers(dest="action", required=True)
    t = bb.add_parser("train", help="pretrain the world backbone contrastively on the pretrain split")
    t.add_argument("--world", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--epochs", type=int, default=6)
    t.add_argument("--batch-size", type=int, default=256)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    t.add_argument("--no-resume", action="store_true", help="start over even if a training state exists")
    t.set_defaults(func=_backbone_train)
    e = bb.add_parser("eval", help="caption<->image retrieval of a backbone on a pairs split")
    e.add_argument("--backbone", required=True, help="e.g. world:runs/backbone or hf:PATH")
    e.add_argument("--world", required=True)
    e.add_argument("--split", default="backbone_val")
    e.set_defaults(func=_backbone_eval)

    feats = sub.add_parser("features", help="the feature cache").add_subparsers(dest="action", required=True)
    x = feats.add_parser("extract", help="encode a world split once into resumable shards")
    x.add_argument("--backbone", required=True)
    x.add_argument("--world", required=True)
    x.add_argument("--split", required=True,
                   help="a pairs split (pretrain, train, backbone_val) or a benchmark (val/single, test/multi, ...)")
    x.add_argument("--out", required=True)
    x.add_argument("--shard-size", type=int, default=2048)
    x.add_argument("--batch-size", type=int, default=128)
    x.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    x.add_argument("--no-patches", action="store_true", help="store only global image features")
    x.set_defaults(func=_features_extract)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched at run time unless the user says so
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from .utils.io import ImageLoadError, ManifestError
    try:
        return args.func(args)
    except (ManifestError, ImageLoadError, FileNotFoundError, ValueError) as exc:
        print(f"foco: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("foco: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
