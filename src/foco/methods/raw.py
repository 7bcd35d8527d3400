"""Methods whose queries need the backbone's text tower at query time (not cached text features).

Such a method has `needs_backbone = True` and `encode_raw(reference_global (B, D), texts: list[str], backbone)
-> ComposedQuery`. Evaluation calls it with the cached reference globals and the raw modification strings:

    queries = compose_raw_queries(method, bf, backbone) if needs_backbone(method) else compose_queries(method, bf)
    metrics = score_queries(queries, bf)          # foco.evaluate, unchanged
"""
from __future__ import annotations

from typing import Protocol, Sequence

import torch

from ..backbones.base import Backbone
from ..evaluate import BenchmarkFeatures
from ..model.encoder import ComposedQuery


class RawTextMethod(Protocol):
    needs_backbone: bool

    def encode_raw(self, reference_global: torch.Tensor, texts: Sequence[str], backbone: Backbone
                   ) -> ComposedQuery: ...


def needs_backbone(method: object) -> bool:
    return bool(getattr(method, "needs_backbone", False))


def compose_raw(method: RawTextMethod, reference_global: torch.Tensor, texts: Sequence[str], backbone: Backbone,
                batch_size: int = 256) -> torch.Tensor:
    """(Q, D) normalised queries from Q reference globals (Q, D) and Q modification strings, in batches."""
    if reference_global.shape[0] != len(texts):
        raise ValueError(f"{reference_global.shape[0]} references for {len(texts)} texts")
    out = []
    for s in range(0, len(texts), batch_size):
        with torch.no_grad():
            out.append(method.encode_raw(reference_global[s:s + batch_size], list(texts[s:s + batch_size]),
                                         backbone).query.float())
    return torch.cat(out) if out else torch.empty(0, reference_global.shape[1])


def compose_raw_queries(method: RawTextMethod, bf: BenchmarkFeatures, backbone: Backbone, batch_size: int = 256
                        ) -> torch.Tensor:
    """`foco.evaluate.compose_queries` for a raw-text method on a world benchmark: (Q, D) queries."""
    return compose_raw(method, bf.gallery.global_[bf.ref_index], bf.bench.modifications, backbone, batch_size)
