"""One trainer harness: a trainer declares what it trains (`Plan`: the module, its phases, the loop's settings and
its save step); `train_run` does the rest, the same way for every trainer.

The rest is: refuse a folder that holds a run unless it is continued, seed torch and numpy from the run's seed, run
the phases through `foco.train.loop.run` on the run's device and ranks (`RunContext`), and save on the main rank
only. The order is fixed: the seed is set before the trainer builds anything, so the weights a trainer initialises
are the same whichever device or rank count the run has; with several ranks, torch is then seeded seed + rank, so
that ranks draw different dropout masks (each rank's RNG states are saved with the training state).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .distributed import RunContext
from .loop import LoopConfig, OnStep, Phase, refuse_overwrite, run


@dataclass
class Plan:
    """What one trainer trains. `loop`'s `env` and `device` are the harness's: they are set from the run's context."""

    model: torch.nn.Module  # the weights the loop trains, checkpoints and resumes
    phases: list[Phase]
    loop: LoopConfig
    save: Callable[[dict], None]  # the run's settings history -> writes the checkpoint; called on the main rank only
    generator: torch.Generator | None = None  # a torch RNG the steps draw from: saved and restored with the state
    on_step: OnStep | None = None
    on_epoch: Callable[[dict], None] | None = None  # after each epoch's log record (e.g. a val curve)


def check_out(ctx: RunContext, resume: bool) -> None:
    """`resume=False` refuses an output folder that holds a run. `train_run` checks it; a trainer whose
    preparation is costly (parsing captions, joining tables) calls it first too, so that a refusal costs nothing."""
    if ctx.out is None:
        raise ValueError("a training run needs an output folder (RunContext.out)")
    refuse_overwrite(Path(ctx.out), resume, "continue it (resume=True; every foco training command continues a "
                                            "run by default) or choose another output folder")


def train_run(ctx: RunContext, build: Callable[[RunContext], Plan], resume: bool, refuse: bool = True) -> Plan:
    """Runs the trainer that `build` declares, in `ctx.out` with `ctx.seed` on `ctx`'s device and ranks, and returns
    its plan (its `model` trained, in eval mode). `resume=False` refuses a folder that holds a run (`refuse`);
    `resume=True` continues it where it left off."""
    if refuse:
        check_out(ctx, resume)
    out = Path(ctx.out)
    torch.manual_seed(ctx.seed)
    rng = np.random.default_rng(ctx.seed)
    plan = build(ctx)
    if ctx.world_size > 1:  # the weights are built alike on every rank; from here each rank draws its own masks
        torch.manual_seed(ctx.seed + ctx.rank)
    loop = replace(plan.loop, env=ctx, device=ctx.device)
    extra = {} if plan.on_epoch is None else {"on_epoch": plan.on_epoch}  # passed only where a trainer has one
    history = run(plan.model, plan.phases, out, loop, rng, resume, plan.generator, plan.on_step, **extra)
    if ctx.is_main:
        plan.save(history)
    return plan
