"""foco: Focus-then-Complete zero-shot composed image retrieval.

The public API, loaded lazily: `import foco` needs only torch and numpy, and each name imports its module on first
use. The pipeline, in the order data flows:

    backbone = foco.create_backbone("world:pretrained")       # frozen CLIP-style towers
    parts = foco.read_benchmark("cirr", "/data/CIRR", "val")                 # any benchmark, one common form
    method = foco.build_method("foco", "runs/quickstart/foco")              # or "sum", "slerp", "pic2word", ...
    results = foco.evaluate(parts, foco.cached_features(backbone, cache), foco.EvalConfig(methods=("foco",)))
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {
    # backbones: frozen image and text towers
    "Backbone": "foco.backbones.base", "ImageFeatures": "foco.backbones.base", "TextFeatures": "foco.backbones.base",
    "create_backbone": "foco.backbones", "list_backbones": "foco.backbones", "BACKBONES": "foco.backbones",
    # caption decomposition (training data)
    "build_decomposer": "foco.decompose", "DECOMPOSERS": "foco.decompose",
    # the model: F_Aggr + F_Comp, the one composed-query encoder
    "ComposedQueryEncoder": "foco.model", "FoCoConfig": "foco.model", "ComposedQuery": "foco.model.encoder",
    # methods: one interface, one registry
    "build_method": "foco.methods", "METHODS": "foco.methods", "MethodOptions": "foco.methods",
    "QueryBatch": "foco.methods", "QueryMethod": "foco.methods",
    # benchmarks: readers into one form, and their feature caches
    "read_benchmark": "foco.benchmarks", "BENCHMARKS": "foco.benchmarks", "CIRBenchmark": "foco.benchmarks",
    # training
    "train_foco": "foco.train.foco", "FoCoTrainConfig": "foco.train.foco",
    # evaluation: compose -> rank -> score
    "evaluate": "foco.eval.evaluate", "EvalConfig": "foco.eval.evaluate", "cached_features": "foco.eval.evaluate",
    "compose": "foco.eval.compose", "rank": "foco.eval.rank", "score": "foco.eval.rank",
    "results_table": "foco.eval.report",
}
__all__ = [*_API, "__version__"]


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'foco' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
