"""Every training command's one resume rule: its flags, their checks, and --restart once the ranks are up."""
from __future__ import annotations

import argparse
import sys

from ..train.resume_rule import RESUME_RULE
from .common import setting_list


def add_resume_args(p: argparse.ArgumentParser) -> None:
    """Every training command's one resume rule (`RESUME_RULE`): `--restart`, and the old `--resume` and
    `--no-resume`, which keep working with a deprecation note."""
    p.add_argument("--restart", action="store_true",
                   help="start over: remove the run in --out (its state, logs and weights) and train from the start; "
                        "without it, " + RESUME_RULE.split("; ")[0])
    p.add_argument("--resume", action="store_true",
                   help="deprecated: continuing a run in --out is the default (it still refuses a --out with no run)")
    p.add_argument("--no-resume", action="store_true", help="deprecated: the same as --restart")


def resume_flags(a: argparse.Namespace):
    """The resume rule's flags as a typed `ResumeFlags`."""
    from ..train.resume_rule import ResumeFlags
    return ResumeFlags(bool(getattr(a, "restart", False)), bool(getattr(a, "resume", False)),
                       bool(getattr(a, "no_resume", False)))


def check_resume(a: argparse.Namespace) -> None:
    """The flags of the resume rule, checked once before anything runs (`foco.train.resume_rule`)."""
    from ..train.resume_rule import check_resume_flags
    if getattr(a, "resume_checked", False):
        return
    a.resume_checked = True
    flags = resume_flags(a)
    check_resume_flags(a.out, flags, note=lambda line: print(line, file=sys.stderr))


def start_or_continue(a: argparse.Namespace, env=None) -> bool:
    """Applies the resume rule once the ranks are up (`env`, a `RunContext`, or None on one process): with
    --restart the main rank clears --out and the others wait for it. Returns the trainers' `resume` (always True: a
    run in --out, if one is left, is continued)."""
    from ..train.resume_rule import apply_resume_rule
    check_resume(a)
    note = apply_resume_rule(a.out, resume_flags(a), env)
    if note:
        print(note, file=sys.stderr)
    return True


def add_allow_changed(p: argparse.ArgumentParser) -> None:
    """--allow-changed on every trainer: settings a resumed run may change, recorded from where it stands."""
    p.add_argument("--allow-changed", type=setting_list, action="extend", default=[], metavar="SETTING[,SETTING]",
                   help="continuing a run: train on with these settings changed, named as the run records them (e.g. "
                        "lr_stage1 or lr-stage1, max_negatives, model.learn_bias); the change is recorded from the "
                        "epoch it takes effect, never over the past (otherwise a changed setting is refused)")
