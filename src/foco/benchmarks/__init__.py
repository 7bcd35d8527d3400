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

from pathlib import Path
from typing import Any

from ..registry import Registry
from .base import BenchmarkReader, CIRBenchmark, CIRQuery, EvalProtocol, ImageRef, ReaderOption, check_images

BENCHMARKS = Registry("benchmark")  # name -> BenchmarkReader
BENCHMARKS.register("fashioniq", "foco.benchmarks.fashioniq:READER")
BENCHMARKS.register("cirr", "foco.benchmarks.cirr:READER")
BENCHMARKS.register("circo", "foco.benchmarks.circo:READER")
BENCHMARKS.register("genecis", "foco.benchmarks.genecis:READER")
BENCHMARKS.register("world", "foco.benchmarks.world:READER")
BENCHMARKS.register("oacirr", "foco.benchmarks.oacirr:READER")


def read_benchmark(name: str, root: str | Path, split: str = "val", check_files: bool = True,
                   **options: Any) -> list[CIRBenchmark]:
    """Reads benchmark `name` from `root` in its official layout, then checks that every image file exists.

    Options: each reader's `READER.options` (fashioniq `join`; genecis `tasks`, `coco_dir`, `vg_dir`; world
    `protocols`); `categories` for fashioniq too.
    """
    parts = BENCHMARKS.get(name).read(root, split, **options)
    if check_files:
        check_images(parts)
    return parts


__all__ = ["BENCHMARKS", "BenchmarkReader", "CIRBenchmark", "CIRQuery", "EvalProtocol", "ImageRef", "ReaderOption",
           "check_images", "read_benchmark"]
