"""Every trainer's one resume rule, typed: a run left in the output folder is continued where it left off (changed
settings refused unless allowed); a restart clears it first, on the main rank, once the ranks are up."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

log = logging.getLogger(__name__)

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


def check_resume_flags(out: str | Path, flags: ResumeFlags, note: Callable[[str], None] = log.warning) -> None:
    """The flags checked before anything runs: the deprecated ones are noted (`note`: the CLI prints to stderr),
    before any refusal; --resume with no run in `out` is refused (starting afresh silently would hide a mistyped
    folder), and so is --resume with --restart."""
    from ..utils.checkpoint import has_training_state
    if flags.no_resume:
        note("foco: --no-resume is deprecated; it means --restart")
    if flags.resume:
        if flags.restarting:
            raise ValueError("--resume and --restart contradict each other: drop one (continuing is the default)")
        note("foco: --resume is deprecated: " + RESUME_RULE)
        if not has_training_state(Path(out) / "train_state"):
            raise ValueError(f"--resume: {out} holds no training run to continue; drop --resume to start one")


def apply_resume_rule(out: str | Path, flags: ResumeFlags, env=None) -> str | None:
    """Once the ranks are up (`env`, a `RunContext`, or None on one process): with a restart the main rank clears
    `out` and the others wait for it. A run left in `out` is then continued by the trainer. Returns the note of
    what a restart removed (None when nothing was)."""
    from .distributed import barrier
    from .loop import clear_run
    removed = clear_run(out) if flags.restarting and (env is None or env.is_main) else []
    if env is not None:
        barrier(env)
    return f"foco: --restart: removed {', '.join(removed)} from {out}" if removed else None
