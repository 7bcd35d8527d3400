"""Every trainer's one resume rule, typed: a run left in the output folder is continued where it left off (changed
settings refused unless allowed); a restart clears it first, on the main rank, once the ranks are up."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

RESUME_RULE = ("a run in --out is continued where it left off (changed settings refused unless --allow-changed); "
               "--restart starts it over")


@dataclass(frozen=True)
class ResumeFlags:
    """--restart, and the deprecated --resume (continuing is the default; it still refuses a --out with no run) and
    --no-resume (the same as --restart)."""
    restart: bool = False
    resume: bool = False
    no_resume: bool = False

    @property
    def restarting(self) -> bool:
        return self.restart or self.no_resume


def check_resume_flags(out: str | Path, flags: ResumeFlags) -> None:
    """The flags checked before anything runs: the deprecated ones are noted; --resume with no run in `out` is
    refused (starting afresh silently would hide a mistyped folder), and so is --resume with --restart."""
    from ..utils.checkpoint import has_training_state
    if flags.no_resume:
        print("foco: --no-resume is deprecated; it means --restart", file=sys.stderr)
    if flags.resume:
        if flags.restarting:
            raise ValueError("--resume and --restart contradict each other: drop one (continuing is the default)")
        print("foco: --resume is deprecated: " + RESUME_RULE, file=sys.stderr)
        if not has_training_state(Path(out) / "train_state"):
            raise ValueError(f"--resume: {out} holds no training run to continue; drop --resume to start one")


def apply_resume_rule(out: str | Path, flags: ResumeFlags, env=None) -> None:
    """Once the ranks are up (`env`, a `RunContext`, or None on one process): with a restart the main rank clears
    `out` and the others wait for it. A run left in `out` is then continued by the trainer."""
    from .distributed import barrier
    from .loop import clear_run
    if flags.restarting and (env is None or env.is_main):
        removed = clear_run(out)
        if removed:
            print(f"foco: --restart: removed {', '.join(removed)} from {out}", file=sys.stderr)
    if env is not None:
        barrier(env)
