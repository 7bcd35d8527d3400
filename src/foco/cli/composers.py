"""`foco pact train` and `foco tscir train`: the methods that compose in the text tower, trained on ITT triplets."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .rules import declare
from .common import (add_device_arg, add_distributed_args, add_owned_output, learning_rate, lora_alpha, loss_weight,
                     nonneg_int, positive_int, run_context, seed_int)
from .resume import add_allow_changed, add_resume_args, check_resume, start_or_continue


def _common(a: argparse.Namespace):
    from ..backbones import create_backbone
    from ..backbones.tunable import TextTuneConfig
    from ..train.sources import edit_records, training_data
    check_resume(a)
    if getattr(a, "world", None):  # tscir: the retrieved targets are checked against --split's scenes
        from ..features import FeatureCache
        FeatureCache(a.features).check_source("split", a.split, f"--split {a.split}",
                                              "pass the --split the features were extracted from")
    # torchrun ... -m foco pact ...: the run's context, made once and passed down
    env = run_context(a)
    start_or_continue(a, env)  # --restart clears --out here; a run left in it is continued
    data = training_data(a.features)  # their features' cache (or corpus): the edit table joins them
    spec = a.backbone or data.backbone_spec
    text = TextTuneConfig(kind=a.text_tuning, lora_rank=a.lora_rank, lora_alpha=a.lora_alpha)
    backbone, records = create_backbone(spec, env.device), edit_records(a.edits, a.edit_settings)
    table = data.edit_table(backbone, records, a.edit_features or Path(a.out) / "edit-features", env)
    return records, backbone, table, text, env


def _leave(env) -> bool:
    """Leaves the process group (under torchrun) together with the other ranks; True on the rank that reports."""
    from ..train.distributed import shutdown
    shutdown(env)
    return env.is_main


def _pact_train(a: argparse.Namespace) -> int:
    from ..train.pact import PACTTrainConfig, train_pact
    _, backbone, edits, text, env = _common(a)
    cfg = PACTTrainConfig(identity_epochs=a.identity_epochs, joint_epochs=a.joint_epochs, batch_size=a.batch_size,
                          lr_warmup=a.lr_warmup, lr_mapper=a.lr_mapper, lr_text=a.lr_text,
                          compose_weight=a.compose_weight, preserve_weight=a.preserve_weight,
                          visual_weight=a.visual_weight, negatives=not a.no_negatives, mapper_init=a.mapper_init,
                          max_steps=a.max_steps, seed=a.seed, text=text, device=env.device,
                          allow_changed=tuple(a.allow_changed))
    train_pact(edits, backbone, a.out, cfg, resume=True, ctx=env)  # the resume rule
    if not _leave(env):
        return 0
    print(f"PACT in {a.out}; use it with foco eval --methods pact --pact {a.out} (Chord: --chord val)")
    return 0


def _tscir_train(a: argparse.Namespace) -> int:
    from ..train.targets import parse_threshold
    from ..train.tscir import TSCIRTrainConfig, train_tscir
    records, backbone, edits, text, env = _common(a)
    cfg = TSCIRTrainConfig(stage1_epochs=a.stage1_epochs, stage2_epochs=a.stage2_epochs, batch_size=a.batch_size,
                           lr_stage1=a.lr_stage1, lr_stage2=a.lr_stage2, soft_weight=a.soft_weight,
                           threshold=parse_threshold(a.target_threshold), max_triplets=a.max_triplets,
                           max_steps=a.max_steps, seed=a.seed, text=text, device=env.device,
                          allow_changed=tuple(a.allow_changed))
    _, match = train_tscir(edits, backbone, a.out, cfg, resume=True, ctx=env)  # the resume rule
    if not _leave(env):
        return 0
    print(match.summary())
    if a.world:
        report = check_world_targets(a, records, match)
        print("retrieved targets against the world's scenes (fit the target caption / exactly the edited scene): "
              + ", ".join(f"{k} {v.get('fits', 0)}/{v.get('retrieved', 0)}, {v.get('right', 0)}/{v.get('parsed', 0)}"
                          for k, v in report.items()))
    print(f"TSCIR in {a.out}; use it with foco eval --methods tscir --tscir {a.out}")
    return 0


def check_world_targets(a: argparse.Namespace, records: list, match) -> dict:
    """How often the retrieved targets of `records` are right, from the world's manifests; written to
    OUT/targets_check.json."""
    from ..features import FeatureCache
    from ..utils.io import atomic_write_text, read_jsonl
    from ..world.scene import Scene
    from ..world.targets import check_targets
    scenes = {str(r["id"]): Scene.from_dict(r["scene"])
              for r in read_jsonl(Path(a.world) / "pairs" / f"{a.split}.jsonl", required=("id", "scene"))}
    image_ids = FeatureCache(a.features).ids("images")  # the rows of match.rows
    records = [r.to_dict() for r in records]
    sources = [scenes[r["source_id"]] for r in records]
    got = [scenes[image_ids[row]] if row >= 0 else None for row in match.rows.tolist()]
    report = check_targets(records, sources, got)
    atomic_write_text(Path(a.out) / "targets_check.json", json.dumps(
        {"threshold": match.threshold, "kept": int(match.kept.sum()), "triplets": len(records), "per_kind": report},
        indent=2) + "\n")
    return report


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--features", required=True, help="feature cache of the training split (the source images)")
    p.add_argument("--edits", required=True, help="SQLite store of `foco edits generate`")
    p.add_argument("--edit-settings", default=None, help="which generator settings of the store (if several)")
    p.add_argument("--edit-features", default=None, help="cache of the edit texts (default OUT/edit-features)")
    p.add_argument("--backbone", default=None, help="default: the backbone recorded in the feature cache")
    p.add_argument("--out", required=True, help="output folder (created; rerun the same command to resume)")
    add_owned_output(p, signature=("train_state", "train_log.jsonl"), kind="text composer (PACT, TSCIR)")
    add_owned_output(p, dest="edit_features", kind="feature cache")
    p.add_argument("--batch-size", type=positive_int, default=128, help="examples per step")
    p.add_argument("--text-tuning", default="auto", choices=["auto", "world-head", "lora"],
                   help="the text tower's trainable part: LoRA (hf) or the TextHead copy (world); auto by backbone")
    p.add_argument("--lora-rank", type=positive_int, default=8, help="LoRA rank (hf text tower)")
    p.add_argument("--lora-alpha", type=lora_alpha, default=16.0, help="LoRA alpha (hf text tower)")
    p.add_argument("--max-steps", type=positive_int, default=None, help="cap on each phase's steps (smoke runs)")
    p.add_argument("--seed", type=seed_int, default=0, help="random seed (same seed, same result)")
    add_resume_args(p)
    add_allow_changed(p)
    add_device_arg(p)
    add_distributed_args(p, sync=False)


def register(sub: argparse._SubParsersAction) -> None:
    pact = sub.add_parser("pact", help="PACT: preserve-and-compose training on ITT triplets").add_subparsers(
        dest="action", required=True)
    p = pact.add_parser("train", help="train PACT's mapper and text tower on edit triplets")
    _data_args(p)
    p.add_argument("--identity-epochs", type=nonneg_int, default=1,
                   help="warm-up of the mapper alone (0 with --mapper-init)")
    p.add_argument("--joint-epochs", type=nonneg_int, default=3,
                   help="epochs of joint mapper + text-tower updates on the triplets")
    p.add_argument("--lr-warmup", type=learning_rate, default=1e-4,
                   help="the mapper's learning rate in the identity warm-up")
    p.add_argument("--lr-mapper", type=learning_rate, default=3e-5,
                   help="the mapper's learning rate in the joint updates")
    p.add_argument("--lr-text", type=learning_rate, default=1e-5,
                   help="the text tower's learning rate in the joint updates")
    p.add_argument("--compose-weight", type=loss_weight, default=1.0, help="L_compose (0: preserve-only ablation)")
    p.add_argument("--preserve-weight", type=loss_weight, default=1.0, help="L_preserve (0: compose-only ablation)")
    p.add_argument("--visual-weight", type=loss_weight, default=0.0, help="alpha of L_visual")
    p.add_argument("--no-negatives", action="store_true", help="no negative captions in L_compose")
    p.add_argument("--mapper-init", default=None, help="a Pic2Word checkpoint to start the mapper from")
    p.set_defaults(func=_pact_train)
    declare(p, reads={"features": "feature cache", "edits": "edit store", "backbone": "backbone"},
            values=("edit_settings", "mapper_init"))

    tscir = sub.add_parser("tscir", help="TSCIR: mapping, then composing on synthetic triplets").add_subparsers(
        dest="action", required=True)
    t = tscir.add_parser("train", help="train TSCIR's two stages")
    _data_args(t)
    t.add_argument("--stage1-epochs", type=nonneg_int, default=3, help="epochs of the first stage")
    t.add_argument("--stage2-epochs", type=nonneg_int, default=3, help="epochs of the second stage")
    t.add_argument("--lr-stage1", type=learning_rate, default=1e-4, help="learning rate of the first stage")
    t.add_argument("--lr-stage2", type=learning_rate, default=1e-5, help="learning rate of the second stage")
    t.add_argument("--soft-weight", type=loss_weight, default=1.0, help="weight of the soft text alignment")
    t.add_argument("--target-threshold", default="auto",
                   help="a cosine, or 'auto': the corpus's median caption-image cosine")
    t.add_argument("--max-triplets", type=positive_int, default=None, help="keep at most this many synthetic triplets")
    t.add_argument("--world", default=None, help="a world folder: check the retrieved targets against its scenes")
    t.add_argument("--split", default="train", help="with --world: the pairs split of --features")
    t.set_defaults(func=_tscir_train)
    declare(t, reads={"features": "feature cache", "edits": "edit store", "backbone": "backbone", "world": "world"},
            values=("edit_settings", "target_threshold", "split"))
