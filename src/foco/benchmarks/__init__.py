"""The ZS-CIR benchmarks in their official formats (FashionIQ, CIRR, CIRCO, GeneCIS) and the embedded world's,
all read into one form (`CIRBenchmark`) and evaluated by the same caching, ranking and metric code.

    parts = read_benchmark("cirr", "/data/CIRR", "val")          # -> list[CIRBenchmark]

    foco eval --benchmark {fashioniq,cirr,circo,genecis,world} --root PATH --split {val,test} \
              --checkpoint DIR [--backbone SPEC] [--methods foco,image,text,sum] [--cache DIR] [--out results.json]

Layouts and protocols: the docstrings of `fashioniq`, `cirr`, `circo`, `genecis` (GeneCIS image folders default to
ROOT/val2017 and ROOT/VG_100K_all; `--genecis-coco`, `--genecis-vg` override them). Every annotation file and image
is checked before anything is encoded; problems are reported with counts (ManifestError, ImageLoadError).

Feature caches (`cache`): by default `runs/cache/<benchmark>-<split>/<backbone>/` under the current directory, not
under the dataset root (often read-only or shared): per part `gallery/` (global features only), `references/`
(global + patches, for FoCo) and `texts-<hash>/`. Extraction is resumable; rerunning reuses every finished shard.
Test splits of CIRR and CIRCO produce server submission files (`submission`), beside `--out` by default.
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
