"""Spherical interpolation of the reference image and the modification text (SlerpTAT's composition).

    q(alpha) = sin((1 - alpha) theta) / sin(theta) * v + sin(alpha theta) / sin(theta) * t,   cos(theta) = v . t

with v and t the L2-normalised reference-image and modification-text globals: alpha = 0 is the image, alpha = 1
the text, and every q(alpha) has unit norm. alpha is chosen on the val benchmark over `ALPHA_GRID`
(`foco.eval.select.choose_on_val`).

`slerp` is the training-free part of SlerpTAT. `slerp-tat` is the whole method: the same composition on the
features of an image tower tuned with LoRA toward the frozen text tower (text-anchored tuning, `foco tat train`,
`foco.train.tat`). Its `--tat` folder records the tuned backbone (`tat:PATH`), so evaluation, search and serving
refuse it beside features of any other backbone, the untuned base included, naming both; extract the features
with `--backbone tat:PATH`.

`--slerp-alpha` (`ALPHA`) is a number, or `val`: evaluation then chooses alpha on the val split (`foco.eval`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..model.encoder import ComposedQuery
from ..utils.parse import number_or_word
from .base import MethodOption, MethodOptions, QueryBatch, QueryMethod

DEFAULT_ALPHA = 0.5  # where no alpha is given or chosen (serving)
ALPHA_GRID = tuple(round(0.05 * i, 2) for i in range(21))  # 0.0, 0.05, ..., 1.0: the values tried on val


def alpha_or_val(v: str) -> float | str:
    """A finite alpha in [0, 1], or "val" (chosen on the val split)."""
    return number_or_word(v, "val", "--slerp-alpha", 0.0, 1.0)


ALPHA = MethodOption("slerp_alpha", "--slerp-alpha", "slerp's alpha (0: image, 1: text), or 'val' to choose it on "
                     "the val split", default="val", parse=alpha_or_val, strict=False, val_grid=ALPHA_GRID)


def slerp(v: torch.Tensor, t: torch.Tensor, alpha: float, eps: float = 1e-6) -> torch.Tensor:
    """(B, D), (B, D) -> (B, D) unit vectors on the great circle from normalize(v) (alpha 0) to normalize(t) (1).
    Nearly parallel pairs fall back to the normalised linear interpolation."""
    v, t = F.normalize(v.float(), dim=-1), F.normalize(t.float(), dim=-1)
    cos = (v * t).sum(-1, keepdim=True).clamp(-1.0, 1.0)  # (B, 1)
    theta = torch.acos(cos)  # (B, 1)
    sin = torch.sin(theta)  # (B, 1)
    small = sin < eps
    safe = torch.where(small, torch.ones_like(sin), sin)
    w_v = torch.where(small, torch.full_like(sin, 1 - alpha), torch.sin((1 - alpha) * theta) / safe)  # (B, 1)
    w_t = torch.where(small, torch.full_like(sin, alpha), torch.sin(alpha * theta) / safe)  # (B, 1)
    return F.normalize(w_v * v + w_t * t, dim=-1)


TAT = MethodOption("tat", "--tat", "a text-anchored tuning folder (`foco tat train --out`); the features must be "
                   "extracted with --backbone tat:FOLDER", record="tat.json", own_backbone="tat")


class SlerpMethod(QueryMethod):
    """slerp(reference global, modification global, alpha)."""

    options = (ALPHA,)

    def __init__(self, alpha: float = DEFAULT_ALPHA):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        self.alpha = alpha

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "SlerpMethod":
        alpha = opts.get(ALPHA.name, DEFAULT_ALPHA)
        if alpha == "val":
            raise ValueError("slerp's alpha 'val' is chosen on the val split by evaluation (`foco.eval.evaluate`); "
                             "build the method with a number")
        return cls(float(alpha))

    def encode(self, batch: QueryBatch) -> ComposedQuery:
        return ComposedQuery(slerp(batch.reference.global_, batch.modification.global_, self.alpha), attention=None,
                             v_loc=None)


class SlerpTATMethod(SlerpMethod):
    """SlerpTAT (Jang et al., ECCV 2024): slerp on the features of the TAT-tuned image tower (module docstring).
    The composition is slerp's; what differs is the features it reads, which `--tat` names and the provenance
    checks hold to (`foco.methods.provenance`)."""

    options = (ALPHA, TAT)

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "SlerpTATMethod":
        from .base import require
        require(opts, TAT, "slerp-tat")
        return super().from_options(opts)
