"""Composed-query methods with FoCo's interface: `encode(reference, modification) -> ComposedQuery`.

The simple baselines need no training: the reference image alone, the modification text alone, and the
normalised sum of both (the "image + text" late fusion of the ZS-CIR literature).
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F

from .backbones.base import ImageFeatures, TextFeatures
from .model.encoder import ComposedQuery, ComposedQueryEncoder


class QueryMethod(Protocol):
    def encode(self, reference: ImageFeatures, modification: TextFeatures) -> ComposedQuery: ...


def _plain(q: torch.Tensor) -> ComposedQuery:
    return ComposedQuery(query=F.normalize(q, dim=-1), attention=None, v_loc=None)


class ImageOnly:
    def encode(self, reference: ImageFeatures, modification: TextFeatures) -> ComposedQuery:
        return _plain(reference.global_)


class TextOnly:
    def encode(self, reference: ImageFeatures, modification: TextFeatures) -> ComposedQuery:
        return _plain(modification.global_)


class ImageTextSum:
    def encode(self, reference: ImageFeatures, modification: TextFeatures) -> ComposedQuery:
        return _plain(F.normalize(reference.global_, dim=-1) + F.normalize(modification.global_, dim=-1))


class FoCoMethod:
    """A trained FoCo checkpoint, run without gradients."""

    def __init__(self, checkpoint: str | Path):
        self.model = ComposedQueryEncoder.load(checkpoint)

    @torch.inference_mode()
    def encode(self, reference: ImageFeatures, modification: TextFeatures,
               anchor: torch.Tensor | None = None) -> ComposedQuery:
        """`anchor` (B, D): a separate anchor text for F_Aggr (T_m decomposed, paper §3.4); default T_m."""
        return self.model.encode(reference, modification, anchor=anchor)


METHODS = ("foco", "image", "text", "sum")


def build_method(name: str, checkpoint: str | Path | None = None, *, pic2word: str | Path | None = None,
                 slerp_alpha: float = 0.5) -> QueryMethod:
    """Every method by name: FoCo (needs `checkpoint`), the simple baselines, slerp and Pic2Word (needs `pic2word`,
    the mapper folder). The one factory behind the world and the official-benchmark evaluations."""
    if name == "foco":
        if checkpoint is None:
            raise ValueError("method 'foco' needs --checkpoint")
        return FoCoMethod(checkpoint)
    if name == "slerp":
        from .methods import SlerpMethod
        return SlerpMethod(float(slerp_alpha))
    if name == "pic2word":
        if pic2word is None:
            raise ValueError("method pic2word needs --pic2word DIR (train one with `foco pic2word train`)")
        from .methods import Pic2WordMethod
        return Pic2WordMethod.load(pic2word)
    simple = {"image": ImageOnly, "text": TextOnly, "sum": ImageTextSum}
    if name not in simple:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS + ('slerp', 'pic2word'))}")
    return simple[name]()
