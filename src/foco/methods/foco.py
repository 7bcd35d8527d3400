"""FoCo as a method: a trained `ComposedQueryEncoder` run without gradients (paper §3.4), and the optional variant
that decomposes T_m at inference so that F_Aggr's anchor is T_m's first local phrase (`foco+rule`, `foco+llm`)."""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch

from ..model.encoder import ComposedQuery, ComposedQueryEncoder
from .base import MethodOptions, QueryBatch, QueryMethod


class FoCoMethod(QueryMethod):
    """A trained FoCo checkpoint. Reads `QueryBatch.anchor` (T_m decomposed) and `attn_bias` (box anchoring)."""

    reads_anchor = True

    def __init__(self, checkpoint: str | Path | ComposedQueryEncoder):
        """`checkpoint`: a checkpoint folder, or a model in memory (e.g. one being trained)."""
        model = checkpoint if isinstance(checkpoint, ComposedQueryEncoder) else ComposedQueryEncoder.load(checkpoint)
        self.model = model.eval()

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "FoCoMethod":
        if opts.checkpoint is None:
            raise ValueError("method 'foco' needs --checkpoint")
        return cls(opts.checkpoint)

    @torch.inference_mode()
    def encode(self, batch: QueryBatch) -> ComposedQuery:
        return self.model.encode(batch.reference, batch.modification, attn_bias=batch.attn_bias, anchor=batch.anchor)


class FoCoEdits(FoCoMethod):
    """FoCo trained with the edit stage (foco-edits; not in the FoCo paper), side by side with the paper's FoCo."""

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "FoCoEdits":
        if opts.foco_edits is None:
            raise ValueError("method 'foco-edits' needs --foco-edits DIR (a checkpoint of `foco train --edits`)")
        return cls(opts.foco_edits)


class DecomposedFoCo(FoCoMethod):
    """FoCo with T_m decomposed at inference (paper §3.4, optional): the anchor is T_m's first local phrase, encoded
    by the backbone's text tower; the context stays T_m. Subclasses name the decomposer."""

    needs_text_tower = True
    decomposer_name: ClassVar[str] = ""

    def __init__(self, checkpoint: str | Path, backbone):
        super().__init__(checkpoint)
        from ..decompose import build_decomposer
        self.backbone = backbone
        self.decomposer = build_decomposer(self.decomposer_name)

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "DecomposedFoCo":
        if opts.checkpoint is None:
            raise ValueError(f"method 'foco+{cls.decomposer_name}' needs --checkpoint")
        if opts.backbone is None:
            raise ValueError(f"method 'foco+{cls.decomposer_name}' encodes its anchors with the text tower and needs "
                             "--backbone (or a FoCo checkpoint that records it)")
        return cls(opts.checkpoint, opts.backbone)

    @torch.inference_mode()
    def encode(self, batch: QueryBatch) -> ComposedQuery:
        from ..decompose.modification import modification_anchors
        if batch.anchor is not None:
            raise ValueError("FoCo with T_m decomposed makes its own anchors; give none")
        anchors = modification_anchors(list(batch.texts), self.decomposer)
        anchor = self.backbone.encode_texts(anchors).global_.float()  # (B, D)
        return self.model.encode(batch.reference, batch.modification, attn_bias=batch.attn_bias, anchor=anchor)

    def close(self) -> None:
        if hasattr(self.decomposer, "close"):
            self.decomposer.close()


class FoCoRule(DecomposedFoCo):
    decomposer_name = "rule"


class FoCoLLM(DecomposedFoCo):
    decomposer_name = "llm"
