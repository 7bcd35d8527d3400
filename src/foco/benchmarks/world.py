"""The embedded world's benchmarks in the common form: `single` with CIRR's protocol flags, `multi` with CIRCO's.

    ROOT = a world folder (`foco world generate`); parts "world/single" and "world/multi" of the chosen split.
"""
from __future__ import annotations

from pathlib import Path

from ..world.manifest import load_benchmark
from .base import CIRBenchmark, CIRQuery, EvalProtocol, ImageRef

PROTOCOLS = {
    "single": EvalProtocol(remove_reference=True, recall_ks=(1, 5, 10, 50), subset_ks=(1, 2, 3)),
    "multi": EvalProtocol(remove_reference=False, map_ks=(5, 10, 25, 50)),
}


def read_world(root: str | Path, split: str = "test", protocols: tuple[str, ...] = ("single", "multi")
               ) -> list[CIRBenchmark]:
    parts = []
    for protocol in protocols:
        b = load_benchmark(root, split, protocol)
        queries = [CIRQuery(id=qid, reference=ref, texts=(mod,), targets=list(targets), subset=list(subset),
                            category=edit or None)
                   for qid, ref, mod, targets, subset, edit in zip(b.query_ids, b.references, b.modifications,
                                                                   b.targets, b.subsets, b.edit_types)]
        parts.append(CIRBenchmark(name=f"world/{protocol}", split=split,
                                  images={g: ImageRef(p) for g, p in zip(b.gallery_ids, b.gallery_images)},
                                  gallery=list(b.gallery_ids), queries=queries, protocol=PROTOCOLS[protocol]))
    return parts
