"""The ZS-CIR benchmarks in their official formats (FashionIQ, CIRR, CIRCO, GeneCIS) and the embedded world's,
all read into one form (`CIRBenchmark`) and evaluated by the same caching, ranking and metric code.

    parts = read_benchmark("cirr", "/data/CIRR", "val")          # -> list[CIRBenchmark]
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from .base import CIRBenchmark, CIRQuery, EvalProtocol, ImageRef, check_images

# name -> (module, reader); every reader is `read_x(root, split, **options) -> list[CIRBenchmark]`
_READERS = {"fashioniq": ("fashioniq", "read_fashioniq"), "cirr": ("cirr", "read_cirr"),
            "circo": ("circo", "read_circo"), "genecis": ("genecis", "read_genecis"), "world": ("world", "read_world")}
BENCHMARKS = tuple(_READERS)


def read_benchmark(name: str, root: str | Path, split: str = "val", check_files: bool = True,
                   **options: Any) -> list[CIRBenchmark]:
    """Reads benchmark `name` from `root` in its official layout, then checks that every image file exists.

    Options: fashioniq `join` ("both" | "single" | "pic2word") and `categories`; genecis `tasks`, `coco_dir`,
    `vg_dir`; world `protocols`.
    """
    if name not in _READERS:
        raise ValueError(f"unknown benchmark {name!r}; choose from {', '.join(BENCHMARKS)}")
    module, func = _READERS[name]
    parts = getattr(importlib.import_module(f".{module}", __name__), func)(root, split, **options)
    if check_files:
        check_images(parts)
    return parts


__all__ = ["BENCHMARKS", "CIRBenchmark", "CIRQuery", "EvalProtocol", "ImageRef", "check_images", "read_benchmark"]
