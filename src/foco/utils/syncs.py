"""Counting what makes a GPU wait: host reads of tensors (each one drains the device's queue) and collectives.

`StepCounter` patches, while it is active, the tensor methods that read a value on the host (`item`, `tolist`,
`cpu`, `numpy`, `float()`, `int()`, `bool()`) and the collectives of `torch.distributed`, and counts the calls made
from the files it watches (the training step's: `foco.train.loop`, `foco.train.foco`, `foco.train.losses`,
`foco.train.distributed`, `foco.model`). On the CPU every tensor is a host tensor, so it counts the call sites that
would read from a GPU; on CUDA, `torch.cuda.set_sync_debug_mode` reports the real ones. DDP's own all-reduce runs
in C++ and is not counted: the counts are what a step makes on top of DDP's.
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import torch

READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__")
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "broadcast", "barrier",
               "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter", "all_gather_object",
               "broadcast_object_list")
_STEP_FILES = ("train/loop.py", "train/foco.py", "train/losses.py", "train/distributed.py", "model/")


class StepCounter:
    """`with StepCounter() as c: ...` then `c.reads` and `c.collectives` (Counters by name)."""

    def __init__(self, files: tuple[str, ...] = _STEP_FILES):
        root = Path(__file__).resolve().parents[1]  # src/foco
        self.files = tuple(str(root / f) for f in files)
        self.reads: Counter = Counter()
        self.collectives: Counter = Counter()
        self._saved: list[tuple[object, str, object]] = []

    def _watched(self, depth: int) -> bool:
        return sys._getframe(depth).f_code.co_filename.startswith(self.files)

    def __enter__(self) -> "StepCounter":
        import torch.distributed as dist
        for name in READS:
            self._patch(torch.Tensor, name, self.reads)
        for name in COLLECTIVES:
            if hasattr(dist, name):
                self._patch(dist, name, self.collectives)
        return self

    def _patch(self, owner, name: str, counter: Counter) -> None:
        real = getattr(owner, name)
        watched = self._watched

        def counted(*args, **kwargs):
            if watched(2):
                counter[name] += 1
            return real(*args, **kwargs)
        self._saved.append((owner, name, real))
        setattr(owner, name, counted)

    def __exit__(self, *exc) -> None:
        for owner, name, real in reversed(self._saved):
            setattr(owner, name, real)
        self._saved.clear()

    def totals(self) -> dict[str, int]:
        return {"reads": sum(self.reads.values()), "collectives": sum(self.collectives.values())}
