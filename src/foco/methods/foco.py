"""FoCo as a method: a trained `ComposedQueryEncoder` run without gradients (paper §3.4), and the optional variant
that decomposes T_m at inference so that F_Aggr's anchor is T_m's first local phrase (`foco+rule`, `foco+llm`)."""
from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import torch

from ..model.encoder import ComposedQuery, ComposedQueryEncoder
from .base import MethodOption, MethodOptions, QueryBatch, QueryMethod, require, require_backbone

CHECKPOINT = MethodOption("checkpoint", "--checkpoint", "a FoCo checkpoint folder of `foco train`", parse=Path,
                          record="foco.json")
EDITS_CHECKPOINT = MethodOption("foco_edits", "--foco-edits", "a checkpoint of `foco train --edits`", parse=Path,
                                record="foco.json")


class FoCoMethod(QueryMethod):
    """A trained FoCo checkpoint. Reads `QueryBatch.anchor` (T_m decomposed) and `attn_bias` (box anchoring)."""

    reads_patches = True
    reads_anchor = True
    options = (CHECKPOINT,)

    def __init__(self, checkpoint: str | Path | ComposedQueryEncoder):
        """`checkpoint`: a checkpoint folder, or a model in memory (e.g. one being trained)."""
        model = checkpoint if isinstance(checkpoint, ComposedQueryEncoder) else ComposedQueryEncoder.load(checkpoint)
        self.model = model.eval()

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "FoCoMethod":
        return cls(require(opts, CHECKPOINT, "foco"))

    def modules(self) -> list[torch.nn.Module]:
        return [self.model]

    @torch.inference_mode()
    def encode(self, batch: QueryBatch) -> ComposedQuery:
        return self.model.encode(batch.reference, batch.modification, attn_bias=batch.attn_bias, anchor=batch.anchor)


class FoCoEdits(FoCoMethod):
    """FoCo trained with the edit stage (foco-edits; not in the FoCo paper), side by side with the paper's FoCo."""

    options = (EDITS_CHECKPOINT,)

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "FoCoEdits":
        folder = require(opts, EDITS_CHECKPOINT, "foco-edits")
        check_edit_stage(folder, opts.unverified)
        return cls(folder)


def check_edit_stage(folder: str | Path, unverified: bool = False) -> None:
    """Refuses as --foco-edits a checkpoint trained without the edit stage (its row would be foco's), and one whose
    foco.json no longer says (unless `unverified`)."""
    from ..model.encoder import checkpoint_meta
    meta = checkpoint_meta(folder)
    if "recipe" in meta:  # written by a run whose edit stage ran (a resumed one records its first settings)
        return
    epochs = (meta.get("train") or {}).get("stage3_epochs")
    if epochs is None and not unverified:
        raise ValueError(f"--foco-edits {folder}: its foco.json records no train.stage3_epochs, so whether it was "
                         "trained with the edit stage cannot be checked; pass a checkpoint of `foco train --edits`, or "
                         "--unverified to use it unchecked")
    if epochs == 0:
        raise ValueError(f"--foco-edits {folder} was trained without the edit stage (train.stage3_epochs 0 in its "
                         "foco.json): it is a FoCo checkpoint, evaluated as --checkpoint; pass a checkpoint of `foco "
                         "train --edits STORE`")


class DecomposedFoCo(FoCoMethod):
    """FoCo with T_m decomposed at inference (paper §3.4, optional): the anchor is T_m's first local phrase, encoded
    by the backbone's text tower; the context stays T_m. Subclasses name the decomposer."""

    needs_text_tower = True
    served = False  # serving does not decompose T_m
    decomposer_name: ClassVar[str] = ""

    def __init__(self, checkpoint: str | Path, backbone):
        super().__init__(checkpoint)
        from ..decompose import build_decomposer
        self.backbone = backbone
        self.decomposer = build_decomposer(self.decomposer_name)

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "DecomposedFoCo":
        name = f"foco+{cls.decomposer_name}"
        backbone = require_backbone(opts, name, "encodes its anchors with the text tower")
        return cls(require(opts, CHECKPOINT, name), backbone)

    @torch.inference_mode()
    def encode(self, batch: QueryBatch) -> ComposedQuery:
        from ..decompose.modification import modification_anchors
        if batch.anchor is not None:
            raise ValueError("FoCo with T_m decomposed makes its own anchors; give none")
        anchors = modification_anchors(list(batch.texts), self.decomposer)
        anchor = self.backbone.encode_texts(anchors, device=self.device).global_.float()  # (B, D)
        return self.model.encode(batch.reference, batch.modification, attn_bias=batch.attn_bias, anchor=anchor)

    def close(self) -> None:
        if hasattr(self.decomposer, "close"):
            self.decomposer.close()


class FoCoRule(DecomposedFoCo):
    decomposer_name = "rule"


class FoCoLLM(DecomposedFoCo):
    decomposer_name = "llm"
