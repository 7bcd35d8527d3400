"""Training data of FoCo's edit stage (foco-edits, a departure from the paper): ITT triplets of `foco.edits`
joined with cached features, served as `EditBatch`es.

The source images' features come from the training split's cache (global + patches); the instructions, target
captions and negative captions are encoded once into their own text cache (`encode_edit_texts`, resumable). Only
the globals are held in memory; a batch's patches and instruction tokens are read from the shards when it is drawn.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..backbones.base import Backbone, ImageFeatures, TextFeatures
from ..edits.schema import ITTRecord
from ..feature_store import RowView, TokenView
from ..features import ExtractConfig, FeatureCache, extract_texts

if TYPE_CHECKING:
    from .targets import TargetMatch


@dataclass
class EditBatch:
    reference: ImageFeatures  # (B, D) v_g, (B, P, D) patches of the source images
    instruction: TextFeatures  # (B, D), (B, L, D), (B, L): the instruction is anchor and context, as at inference
    target: torch.Tensor  # (B, D) normalised target captions
    negatives: torch.Tensor  # (B, Kn, D) normalised negative captions
    negative_mask: torch.Tensor  # (B, Kn) bool
    texts: list[str]  # the B instructions themselves (methods that re-read them with the text tower)
    target_image: torch.Tensor  # (B, D) normalised global of the retrieved target image; zeros where none
    has_target_image: torch.Tensor  # (B,) bool


@dataclass
class EditTable:
    """T triplets as indices into the image and text features."""

    image_global: torch.Tensor  # (N, D) float32
    patches: "torch.Tensor | RowView"  # (N, P, D) storage dtype; from a cache, read per batch (`RowView`)
    text_global: torch.Tensor  # (Nt, D) float32
    text_tokens: TokenView  # (Nt, L, D) storage dtype and (Nt, L) masks, read per batch
    source: torch.Tensor  # (T,) long: image row
    instruction: torch.Tensor  # (T,) long: text row
    target: torch.Tensor  # (T,) long: text row
    negatives: torch.Tensor  # (T, Kn) long: text rows, -1 where a triplet has fewer
    instructions: list[str]  # (T,) the instruction texts
    source_caption: torch.Tensor  # (T,) long: text row of the source caption
    target_image: torch.Tensor  # (T,) long: image row of the retrieved target image, -1 where none (`with_targets`)

    def __len__(self) -> int:
        return self.source.shape[0]

    def batch(self, idx: torch.Tensor) -> EditBatch:
        """Gathers triplets `idx` (B,) into float32 tensors."""
        src, ins = self.source[idx], self.instruction[idx]  # (B,)
        tokens, mask = self.text_tokens.take(ins)  # (B, L, D), (B, L): L the longest of these B
        neg = self.negatives[idx]  # (B, Kn)
        tgt = self.target_image[idx]  # (B,)
        target_image = F.normalize(self.image_global[tgt.clamp_min(0)], dim=-1) * (tgt >= 0)[:, None]  # (B, D)
        return EditBatch(ImageFeatures(self.image_global[src], self.patches[src].float()),
                         TextFeatures(self.text_global[ins], tokens.float(), mask),
                         F.normalize(self.text_global[self.target[idx]], dim=-1),
                         F.normalize(self.text_global[neg.clamp_min(0)], dim=-1), neg >= 0,
                         [self.instructions[i] for i in idx.tolist()], target_image, tgt >= 0)

    def subset(self, keep: torch.Tensor) -> "EditTable":
        """The triplets where `keep` (T,) is True (e.g. those with a target image)."""
        rows = keep.nonzero().flatten()
        return replace(self, source=self.source[rows], instruction=self.instruction[rows], target=self.target[rows],
                       negatives=self.negatives[rows], instructions=[self.instructions[i] for i in rows.tolist()],
                       source_caption=self.source_caption[rows], target_image=self.target_image[rows])

    def with_targets(self, threshold: "float | str" = "auto") -> tuple["EditTable", "TargetMatch"]:
        """A copy whose triplets carry their target image retrieved from this table's images
        (`foco.train.targets.match_targets`), and the match."""
        from .targets import match_targets
        text = F.normalize(self.text_global.float(), dim=-1)
        images = F.normalize(self.image_global.float(), dim=-1)
        match = match_targets(text[self.target], images, self.source, threshold, text[self.source_caption])
        return replace(self, target_image=match.rows), match


def edit_texts(records: list[ITTRecord], max_negatives: int) -> list[str]:
    return list(dict.fromkeys(t for r in records for t in (r.instruction, r.target_caption, r.source_caption,
                                                             *r.negatives[:max_negatives])))


def encode_edit_texts(backbone: Backbone, records: list[ITTRecord], out: str | Path, max_negatives: int = 3,
                      cfg: ExtractConfig = ExtractConfig()) -> dict:
    """Encodes every instruction, target and negative caption once into `out` (resumable)."""
    return extract_texts(backbone, [(t, t) for t in edit_texts(records, max_negatives)], out, cfg)


def build_edit_table(image_cache: str | Path, text_cache: str | Path, records: list[ITTRecord],
                     max_negatives: int = 3) -> EditTable:
    image_ids, images = FeatureCache(image_cache).stored_images(dtype=None)  # patches stay in the shards
    text_ids, texts = FeatureCache(text_cache).stored_texts(dtype=None)  # tokens stay in the shards
    img, txt = {i: n for n, i in enumerate(image_ids)}, {t: n for n, t in enumerate(text_ids)}
    missing = sorted({r.source_id for r in records} - img.keys())
    if missing:
        raise ValueError(f"{len(missing)} source images of the edits are not in {image_cache}, e.g. {missing[:3]}")
    absent = [t for t in edit_texts(records, max_negatives) if t not in txt]
    if absent:
        raise ValueError(f"{len(absent)} edit texts are not in {text_cache}, e.g. {absent[0]!r}; encode them "
                         "with the same --edit-negatives")
    negatives = torch.full((len(records), max_negatives), -1, dtype=torch.long)
    for n, r in enumerate(records):
        for k, t in enumerate(r.negatives[:max_negatives]):
            negatives[n, k] = txt[t]
    return EditTable(images.global_, images.patches, texts.global_, texts.tokens,
                     torch.tensor([img[r.source_id] for r in records]), torch.tensor([txt[r.instruction] for r in records]),
                     torch.tensor([txt[r.target_caption] for r in records]), negatives,
                     [r.instruction for r in records], torch.tensor([txt[r.source_caption] for r in records]),
                     torch.full((len(records),), -1, dtype=torch.long))
