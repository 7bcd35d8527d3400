"""Numeric precision of encoding and training: fp32, or bf16 autocast (matrix products in bfloat16, reductions
and the optimiser in float32). On a CPU with native bfloat16 (AMX or AVX512-BF16) bf16 roughly halves the time of
the world's feature extraction and FoCo training; elsewhere it is emulated and slower, so `auto` picks it only
where it is native."""
from __future__ import annotations

import contextlib
from functools import lru_cache
from pathlib import Path

import torch

PRECISIONS = ("auto", "fp32", "bf16")


@lru_cache(maxsize=None)
def native_bf16(device: str = "cpu") -> bool:
    """Whether `device` computes bfloat16 matrix products natively."""
    if device.startswith("cuda"):  # native from Ampere (compute capability 8.0); V100 and T4 only emulate it
        if not torch.cuda.is_available():
            return False
        index = torch.device(device).index
        return torch.cuda.get_device_capability(torch.cuda.current_device() if index is None else index)[0] >= 8
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return False
    return bool({"amx_bf16", "avx512_bf16"} & set(flags.split()))


def resolve_precision(precision: str, device: str = "cpu") -> str:
    """"auto" -> "bf16" where native, else "fp32"; "fp32" and "bf16" as given."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose from {', '.join(PRECISIONS)}")
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return precision


def autocast(precision: str, device: str = "cpu"):
    """A context in which the forward pass runs at `precision` ("fp32": nothing changes)."""
    precision = resolve_precision(precision, device)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type="cuda" if str(device).startswith("cuda") else "cpu", dtype=torch.bfloat16)
