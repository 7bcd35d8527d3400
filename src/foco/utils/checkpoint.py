"""Resumable training state without pickle: tensors in safetensors, everything else in JSON.

`save_training_state` stores model weights, the optimiser's per-parameter tensors and hyper-parameters, the torch
and numpy RNG states and any JSON-able progress counters. Both files are written atomically, the JSON last, so a
run killed mid-write leaves the previous complete state readable.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .io import atomic_write_bytes, atomic_write_text, read_json

STATE_TENSORS = "state.safetensors"
STATE_JSON = "state.json"


def _optimizer_to_flat(opt: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for name, val in st.items():
            if torch.is_tensor(val):
                tensors[f"optim/{pid}/{name}"] = val.detach().cpu().contiguous()
            else:
                scalars[f"{pid}/{name}"] = val
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _optimizer_from_flat(opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for key, val in tensors.items():
        if key.startswith("optim/"):
            _, pid, name = key.split("/", 2)
            state.setdefault(int(pid), {})[name] = val
    for key, val in meta["scalars"].items():
        pid, name = key.split("/", 1)
        state.setdefault(int(pid), {})[name] = val
    opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_training_state(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        numpy_rng: np.random.Generator | None, progress: dict[str, Any],
                        extra_tensors: dict[str, torch.Tensor] | None = None) -> None:
    from safetensors.torch import save as st_save
    path = Path(path)
    tensors = {f"model/{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    tensors.update({f"extra/{k}": v.detach().cpu().contiguous() for k, v in (extra_tensors or {}).items()})
    opt_tensors, opt_meta = _optimizer_to_flat(optimizer)
    tensors.update(opt_tensors)
    tensors["rng/torch"] = torch.get_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # dropout on the GPU draws from this one
        tensors["rng/cuda"] = torch.cuda.get_rng_state()  # the current device's (every rank draws alike)
    import hashlib
    data = st_save(tensors)
    meta = {"optimizer": opt_meta, "progress": progress, "tensors_sha256": hashlib.sha256(data).hexdigest(),
            "numpy_rng": numpy_rng.bit_generator.state if numpy_rng is not None else None}
    atomic_write_bytes(path / STATE_TENSORS, data)
    atomic_write_text(path / STATE_JSON, json.dumps(meta, indent=1, sort_keys=True))


def has_training_state(path: str | Path) -> bool:
    return (Path(path) / STATE_JSON).is_file() and (Path(path) / STATE_TENSORS).is_file()


def load_training_state(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        numpy_rng: np.random.Generator | None) -> dict[str, Any]:
    """Restores everything `save_training_state` wrote and returns the progress counters, with the extra
    tensors under progress["extra_tensors"]."""
    from .io import ManifestError, load_tensors, load_weights, sha256_file
    path = Path(path)
    fix = f"the training state is damaged: remove {path} to start the run again"
    try:
        meta = read_json(path / STATE_JSON)
    except ManifestError as exc:
        raise ManifestError(f"{exc}; {fix}") from None
    tensors = load_tensors(path / STATE_TENSORS, fix)
    want = meta.get("tensors_sha256") if isinstance(meta, dict) else None
    if want is not None and sha256_file(path / STATE_TENSORS) != want:
        raise ValueError(f"{path / STATE_TENSORS} does not match the tensors_sha256 in {path / STATE_JSON}; {fix}")
    load_weights(model, {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")},
                 path / STATE_TENSORS, "it was written by another model or width: resume with the same settings, "
                 "or choose another --out")
    try:
        _optimizer_from_flat(optimizer, tensors, meta["optimizer"])
        torch.set_rng_state(tensors["rng/torch"])
        if "rng/cuda" in tensors and torch.cuda.is_available():
            torch.cuda.set_rng_state(tensors["rng/cuda"])
        if numpy_rng is not None and meta.get("numpy_rng") is not None:
            numpy_rng.bit_generator.state = meta["numpy_rng"]
        progress = dict(meta["progress"])
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
        raise ValueError(f"{path / STATE_JSON}: a field does not restore the run ({type(exc).__name__}: {exc}); "
                         f"{fix}") from None
    return {**progress, "extra_tensors": {k[len("extra/"):]: v for k, v in tensors.items() if k.startswith("extra/")}}
