"""Every training command's one resume rule: its flags, their checks, and --restart once the ranks are up."""
from __future__ import annotations

import argparse
from pathlib import Path

from .common import setting_list


RESUME_RULE = ("a run in --out is continued where it left off (changed settings refused unless --allow-changed); "
               "--restart starts it over")


def add_resume_args(p: argparse.ArgumentParser) -> None:
    """Every training command's one resume rule (`RESUME_RULE`): `--restart`, and the old `--resume` and
    `--no-resume`, which keep working with a deprecation note."""
    p.add_argument("--restart", action="store_true",
                   help="start over: remove the run in --out (its state, logs and weights) and train from the start; "
                        "without it, " + RESUME_RULE.split("; ")[0])
    p.add_argument("--resume", action="store_true",
                   help="deprecated: continuing a run in --out is the default (it still refuses a --out with no run)")
    p.add_argument("--no-resume", action="store_true", help="deprecated: the same as --restart")


def check_resume(a: argparse.Namespace) -> None:
    """The flags of the resume rule, checked before anything runs: the deprecated ones are noted; `--resume` with
    no run in --out is refused (starting afresh silently would hide a mistyped folder), and so is `--resume` with
    `--restart`."""
    import sys
    from ..utils.checkpoint import has_training_state
    if getattr(a, "resume_checked", False):
        return
    a.resume_checked = True
    resume, restart = getattr(a, "resume", False), getattr(a, "restart", False)
    if getattr(a, "no_resume", False):
        print("foco: --no-resume is deprecated; it means --restart", file=sys.stderr)
        a.restart = restart = True
    if resume:
        if restart:
            raise ValueError("--resume and --restart contradict each other: drop one (continuing is the default)")
        print("foco: --resume is deprecated: " + RESUME_RULE, file=sys.stderr)
        if not has_training_state(Path(a.out) / "train_state"):
            raise ValueError(f"--resume: {a.out} holds no training run to continue; drop --resume to start one")


def start_or_continue(a: argparse.Namespace, env=None) -> bool:
    """Applies the resume rule once the ranks are up (`env`, a `DistEnv`, or None on one process): with --restart
    the main rank clears --out and the others wait for it. Returns the trainers' `resume` (always True: a run in
    --out, if one is left, is continued)."""
    import sys
    from ..train.distributed import barrier
    from ..train.loop import clear_run
    check_resume(a)
    if getattr(a, "restart", False) and (env is None or env.is_main):
        removed = clear_run(a.out)
        if removed:
            print(f"foco: --restart: removed {', '.join(removed)} from {a.out}", file=sys.stderr)
    if env is not None:
        barrier(env)
    return True


def add_allow_changed(p: argparse.ArgumentParser) -> None:
    """--allow-changed on every trainer: settings a resumed run may change, recorded from where it stands."""
    p.add_argument("--allow-changed", type=setting_list, action="extend", default=[], metavar="SETTING[,SETTING]",
                   help="continuing a run: train on with these settings changed, named as the run records them (e.g. "
                        "lr_stage1 or lr-stage1, max_negatives, model.learn_bias); the change is recorded from the "
                        "epoch it takes effect, never over the past (otherwise a changed setting is refused)")
