"""Target images for ITT triplets, found in the training corpus (TSCIR's synthetic triplets, stage 2; optionally
foco-edits' image target).

TSCIR composes on (reference image, modification, target image) triplets. Without rendering a new scene, the target
image is looked for among the corpus's own images: each triplet's target caption is retrieved against every corpus
image with the frozen backbone (cosine of the text global and the image globals), the source image excluded, and the
best image is kept when its similarity reaches a threshold; otherwise the triplet has no target image.

The seed fixes neither the threshold nor its scale, which differs per backbone. `threshold="auto"` (the default)
calibrates it without labels on the corpus's own image-caption pairs: a retrieved image is accepted when it matches
the target caption at least as well as the median source image matches its own caption (`quantile` 0.5). A number
sets the cosine threshold directly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TargetMatch:
    """The best corpus image of each of T target captions."""

    rows: torch.Tensor  # (T,) long: image row, -1 when below the threshold
    similarity: torch.Tensor  # (T,) float: cosine of the best image (kept or not)
    threshold: float

    @property
    def kept(self) -> torch.Tensor:
        return self.rows >= 0  # (T,) bool

    def summary(self) -> str:
        n, k = self.rows.numel(), int(self.kept.sum())
        return (f"target images: {k} of {n} triplets ({100 * k / max(n, 1):.1f}%) found a corpus image with cosine "
                f">= {self.threshold:.3f}")


def best_images(text: torch.Tensor, images: torch.Tensor, exclude: torch.Tensor, chunk: int = 1024
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """For T normalised texts (T, D): the row of the most similar of N normalised images (N, D) other than
    `exclude[t]` (T,), and its cosine. Chunked over texts: memory is chunk x N."""
    rows, sims = [], []
    for s in range(0, text.shape[0], chunk):
        sim = text[s:s + chunk].float() @ images.float().t()  # (c, N)
        sim.scatter_(1, exclude[s:s + chunk, None], float("-inf"))
        best, row = sim.max(1)  # (c,), (c,)
        rows.append(row)
        sims.append(best)
    return torch.cat(rows), torch.cat(sims)


def own_pair_threshold(caption: torch.Tensor, image: torch.Tensor, quantile: float = 0.5) -> float:
    """The `quantile` of cos(caption_i, image_i) over the corpus's own pairs (S, D) x (S, D)."""
    if caption.shape != image.shape or caption.shape[0] == 0:
        raise ValueError(f"need matching non-empty caption and image features, got {tuple(caption.shape)} and "
                         f"{tuple(image.shape)}")
    return float(torch.quantile((caption.float() * image.float()).sum(-1), quantile))


def match_targets(target_text: torch.Tensor, images: torch.Tensor, source: torch.Tensor,
                  threshold: float | str = "auto", source_caption: torch.Tensor | None = None,
                  quantile: float = 0.5) -> TargetMatch:
    """Retrieves each triplet's target caption (T, D) among the corpus images (N, D), its source `source` (T,)
    excluded. `threshold`: a cosine, or "auto" (`own_pair_threshold` of the source captions (T, D) and images)."""
    if threshold == "auto":
        if source_caption is None:
            raise ValueError('threshold "auto" needs the source captions\' features')
        threshold = own_pair_threshold(source_caption, images[source], quantile)
    rows, sims = best_images(target_text, images, source)
    rows = torch.where(sims >= float(threshold), rows, torch.full_like(rows, -1))
    return TargetMatch(rows, sims, float(threshold))


def parse_threshold(value: str) -> float | str:
    """--target-threshold: "auto" or a cosine in [-1, 1]."""
    from ..utils.parse import number_or_word
    return number_or_word(value, "auto", "--target-threshold", -1.0, 1.0)
