"""`foco ablate`: the paper's ablation table on the world, for the paper recipe or the edit-supervised one."""
from __future__ import annotations

import argparse
from pathlib import Path

from .rules import declare
from .common import add_owned_output, add_device_arg, positive_int


def _seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(dict.fromkeys(int(s) for s in text.split(",") if s.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds {text!r}: give integers separated by commas, e.g. 0,1,2") from None
    if not seeds:
        raise argparse.ArgumentTypeError("--seeds is empty: give e.g. 0,1,2")
    return seeds


def _protocols(text: str) -> tuple[str, ...]:
    from ..benchmarks.world import PROTOCOLS
    chosen = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    bad = [p for p in chosen if p not in PROTOCOLS]
    if bad or not chosen:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(PROTOCOLS)}")
    return chosen


def _ablate(a: argparse.Namespace) -> int:
    from ..ablation.run import AblateConfig, markdown, run_ablation
    from ..ablation.variants import variants
    cfg = AblateConfig(world=Path(a.world), features=Path(a.features), out=Path(a.out), recipe=a.recipe,
                       variants=variants(a.variants), split=a.split, seeds=a.seeds, pairs=a.pairs, size=a.size,
                       precision=a.precision, max_steps=a.max_steps, batch_size=a.batch_size, device=a.device,
                       protocols=a.protocols)
    table = run_ablation(cfg)
    print(markdown(table))
    print(f"tables in {a.out}/ablations.md and {a.out}/ablations.json; checkpoints in {a.out}/{a.recipe}/")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from ..ablation.variants import ABLATIONS
    p = sub.add_parser("ablate", help="the paper's ablation table: train and evaluate every variant",
                       description="Variants: " + ", ".join(f"{n} ({ABLATIONS.get(n).paper_id})"
                                                             for n in ABLATIONS.names()))
    p.add_argument("--world", required=True, help="world folder (the quickstart's OUT/world)")
    p.add_argument("--features", required=True,
                   help="its features folder with train/ and <split>-single/, <split>-multi/ (the quickstart's "
                        "OUT/features)")
    p.add_argument("--recipe", default="paper", choices=["paper", "edits"],
                   help="paper: FoCo's two stages; edits: each variant's paper run resumed into the edit stage "
                        "(foco-edits, not in the FoCo paper)")
    p.add_argument("--variants", default="all",
                   help="'all' (the paper's table), 'backgrounds' (the background feature's readings), 'k-curve' "
                        "(K = 1..5 decomposition pairs per image, the paper's Fig. 3; plotted to "
                        "OUT/k-curve-RECIPE-SPLIT.png) or names separated by commas (full is always added)")
    p.add_argument("--split", default="test", choices=["val", "test"], help="the world split evaluated")
    p.add_argument("--protocols", default=("single", "multi"), type=_protocols,
                   help="the world protocols evaluated, comma-separated (default single,multi; e.g. restaged or "
                        "described, one per table: their features in <split>-<protocol>/); the checkpoints are "
                        "shared, so a second protocol only evaluates")
    p.add_argument("--out", required=True, help="output folder (rerun the same command to resume)")
    add_owned_output(p, kind="ablation run")
    p.add_argument("--seeds", type=_seeds, default=(0,),
                   help="training seeds, e.g. 0,1,2: mean and sd per variant, paired deltas; a sign counts beyond "
                        "noise from 3 seeds on")
    p.add_argument("--pairs", type=positive_int, default=None,
                   help="train on this many of the world's training pairs (a fixed random subset, the same for "
                        "every variant and seed): a time budget")
    p.add_argument("--size", default="default", choices=["tiny", "default"],
                   help="the quickstart's training settings for this world size")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"], help="of FoCo training")
    p.add_argument("--max-steps", type=positive_int, default=None, help="cap on each stage's steps (smoke runs)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="examples per step of every variant instead of the --size plan's (smoke runs, or a memory "
                        "budget); recorded, so one --out holds one batch size")
    add_device_arg(p)
    p.set_defaults(func=_ablate)
    declare(p, reads={"world": "world", "features": "feature caches"}, values=("variants",))
