"""Which torch device a command runs on: the one place that decides it (`--device` on every command that runs a
model).

    auto     cuda:$LOCAL_RANK under torchrun when CUDA is present, else cuda when present, else cpu
    cpu      the CPU
    cuda     the current CUDA device (cuda:$LOCAL_RANK under torchrun)
    cuda:N   CUDA device N
    meta     shapes only (tests)

Every model, batch, loss term and collective of a run lives on the resolved device; data is assembled on the
CPU (in pinned memory when the device is CUDA) and copied over with `to_device`.
"""
from __future__ import annotations

import os

import torch

DEVICE_HELP = "torch device: auto (cuda:$LOCAL_RANK under torchrun, cuda when present, else cpu), cpu, cuda, cuda:N"


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """The device `spec` names, checked: a CUDA device asked for where there is none is refused, naming --device."""
    if isinstance(spec, torch.device):
        return spec
    spec = (spec or "auto").strip()
    local_rank = os.environ.get("LOCAL_RANK")
    if spec == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        spec = "cuda"
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ValueError(f"--device {spec!r} is not a torch device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {spec}: CUDA is not available on this machine (torch {torch.__version__}); "
                             "use --device cpu or auto")
        if device.index is None:
            count = torch.cuda.device_count()
            if local_rank is not None and int(local_rank) < count:
                device = torch.device("cuda", int(local_rank))  # torchrun: one GPU per local rank
            else:  # e.g. one visible GPU per rank (a scheduler sets CUDA_VISIBLE_DEVICES)
                device = torch.device("cuda", torch.cuda.current_device())
        if device.index >= torch.cuda.device_count():
            raise ValueError(f"--device {spec}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def is_cuda(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t` (a CPU tensor) on `device`: through pinned memory with a non-blocking copy when `device` is CUDA."""
    device = torch.device(device)
    if t.device == device:
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def synchronize(device: torch.device | str) -> None:
    """Waits for `device`'s queued work (for timings); nothing on the CPU."""
    if is_cuda(device):
        torch.cuda.synchronize(torch.device(device))


def move(obj, device: torch.device | str):
    """`obj` with every tensor in it on `device` (`to_device`): a tensor, a dataclass, a dict, a list or a tuple
    (batches such as `TrainBatch` and `EditBatch`); anything else is returned as it is."""
    import dataclasses
    if isinstance(obj, torch.Tensor):
        return to_device(obj, device)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: move(getattr(obj, f.name), device)
                                           for f in dataclasses.fields(obj) if f.init})
    if isinstance(obj, dict):
        return {k: move(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(move(v, device) for v in obj)
    return obj
