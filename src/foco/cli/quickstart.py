"""`foco quickstart`: world -> backbone -> decompositions -> FoCo -> foco-edits -> evaluation, on the embedded world."""
from __future__ import annotations

import argparse
import time

from .rules import declare
from .common import add_owned_output, seed_int


def _quickstart(a: argparse.Namespace) -> int:
    from ..eval.report import metrics_table
    from ..quickstart import run_quickstart
    t0 = time.time()
    res = run_quickstart(a.out, a.size, a.seed, a.decomposer, a.train_backbone, a.world_seed, a.precision, a.device,
                         backbone=a.backbone)
    print(f"Benchmark: {res['benchmark']} " + ", ".join(f"{p}: {v['queries']} queries / {v['gallery']} gallery"
                                                     for p, v in res["protocols"].items()) + "\n")
    print(metrics_table(res["methods"], digits=1))
    if res.get("chosen_on_val"):
        print("chosen on val: " + ", ".join(f"{k} {v}" for k, v in res["chosen_on_val"].items()))
    print("foco-edits is FoCo with a third stage on edit triplets written from captions: not in the FoCo paper.")
    print("\nR@1 by edit type (single):\n\n" + metrics_table(res["R@1_by_edit_type"], digits=1))
    suffix = "" if a.decomposer == "oracle" else f"-{a.decomposer}"
    print(f"\nresults in {a.out}/results{suffix}.json; figures in {a.out}/figures{suffix}/ (one query per edit "
          f"type, every method; r1_by_edit_type.png); loss curves in {a.out}/foco{suffix}/loss_curve.png and "
          f"{a.out}/foco-edits{suffix}/loss_curve.png ({time.time() - t0:.0f}s)")
    if res.get("index"):
        print(f"search it: foco serve --index {res['index']} --checkpoint {a.out}/foco{suffix} "
              f"--foco-edits {a.out}/foco-edits{suffix}   (then open http://127.0.0.1:8000/)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    qs = sub.add_parser("quickstart", help="world -> backbone -> decompositions -> FoCo -> evaluation")
    qs.add_argument("--out", required=True, help="output folder (created; rerun the same command to resume)")
    add_owned_output(qs, kind="quickstart run")
    qs.add_argument("--size", default="default", choices=["tiny", "default"],
                    help="world size: tiny (a smoke run) or default")
    qs.add_argument("--seed", type=seed_int, default=0,
                    help="training seed of FoCo and foco-edits (and of the backbone with --train-backbone); same "
                         "seed, same machine, same result")
    qs.add_argument("--world-seed", type=seed_int, default=0, help="seed of the generated world")
    qs.add_argument("--decomposer", default="oracle", choices=["oracle", "rule"],
                    help="training decompositions; rule (spaCy) is the paper's ablation and trains beside oracle")
    qs.add_argument("--backbone", default="vit", choices=["vit", "cnn"],
                    help="the world backbone's image tower: vit (world:vit, the default: transformers' CLIP vision "
                         "tower, read as foco reads CLIP ViT) or cnn (world:pretrained, the CNN with an attention "
                         "pool); both are shipped with foco")
    qs.add_argument("--train-backbone", action="store_true",
                    help="train the world backbone (of --backbone's kind, with its shipped training settings) on "
                         "this world instead of loading the weights shipped with foco")
    qs.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"],
                    help="of feature extraction and FoCo training; auto: bf16 autocast where the CPU computes "
                         "bfloat16 natively (AMX, AVX512-BF16), else fp32")
    from .common import add_device_arg
    add_device_arg(qs)
    qs.set_defaults(func=_quickstart)
    declare(qs)
