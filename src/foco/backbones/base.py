"""The Backbone protocol: what every frozen image-text encoder in `foco` provides.

FoCo (paper §3.2) needs, for each image, a global feature v_g and patch features V_p; for each text, a global
feature c and token features (the contextual caption X enters F_Comp token by token). Every backbone returns
them in one joint embedding space:

* the globals are L2-normalised (cosine similarity = dot product);
* patch and token features are projected into the same space the way the model projects its pooled token
  (CLIP: post-layernorm + visual/text projection applied to every token), and are *not* normalised.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

import torch

if TYPE_CHECKING:
    from PIL import Image


@dataclass
class ImageFeatures:
    """Features of a batch of B images in the joint space of dimension D."""

    global_: torch.Tensor  # (B, D), L2-normalised
    patches: torch.Tensor  # (B, P, D), projected, not normalised
    norm: torch.Tensor | None = None  # (B,) the global's L2 norm before normalisation (raw = global_ * norm[:, None]);
                                      # None where unknown (caches made before foco kept it)


@dataclass
class TextFeatures:
    """Features of a batch of B texts in the joint space of dimension D."""

    global_: torch.Tensor  # (B, D), L2-normalised
    tokens: torch.Tensor  # (B, L, D), projected, not normalised; padded positions are zeros or arbitrary
    mask: torch.Tensor  # (B, L) bool, True on real tokens
    norm: torch.Tensor | None = None  # (B,) the global's L2 norm before normalisation (raw = global_ * norm[:, None],
                                      # LinCIR's regression target); None where the encoder does not give it


@runtime_checkable
class Backbone(Protocol):
    """A frozen image-text encoder. Implementations live in `foco.backbones.*`."""

    embed_dim: int  # D
    num_patches: int  # P
    text_tuning: str  # the trainable text part PACT and TSCIR tune (`backbones.tunable`): "world-head" or "lora"

    # Each runs on the backbone's own device (its inputs are moved there) and hands back float32 features on
    # `device`: the CPU by default (what the feature store writes), the model's device for online encoding.
    def encode_images(self, images: Sequence["Image.Image"], device: str | torch.device = "cpu") -> ImageFeatures: ...

    def encode_texts(self, texts: Sequence[str], device: str | torch.device = "cpu") -> TextFeatures: ...

    @property
    def spec(self) -> str:
        """The registry string that recreates this backbone, e.g. "world:runs/backbone"."""
        ...
