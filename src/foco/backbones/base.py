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
from typing import TYPE_CHECKING, Callable, Protocol, Sequence, runtime_checkable

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


@runtime_checkable
class PixelBackbone(Backbone, Protocol):
    """A `Backbone` whose preprocessing runs apart from its encoder, so that DataLoader workers can do it
    (`foco.corpora.loader`): the workers hand back small tensors, the training or extraction process only encodes.

    * `image_transform()`: a picklable callable, one PIL image -> (3, H, W) uint8 pixels (resized and cropped, not
      yet normalised: a quarter of fp32's bytes cross from the worker and to the device);
    * `encode_pixels(pixels, device)`: (B, 3, H, W) uint8 pixels (a pinned CPU batch, or already on the device) ->
      the `ImageFeatures` of `encode_images`; normalises on the backbone's device;
    * `forward_pixels(pixels, device=None)`: the same in the caller's grad mode, on the backbone's device by
      default (an image tower tuned through it: SlerpTAT's text-anchored tuning, `foco.train.tat`);
    * `text_transform()`: a picklable callable, list of B texts -> (input ids (B, L) int64, mask (B, L) bool) at a
      fixed length L (the text tower's maximum), so that samples collate without looking at each other;
    * `tokenize(texts)`: the same, in this process;
    * `encode_tokens(ids, mask, device)`: the `TextFeatures` of `encode_texts` from such ids. A CPU batch is cut to
      its longest text first where the family pads to the longest (CLIP, world), so the features and their L are
      exactly those of `encode_texts`.

    `encode_images(images)` is `encode_pixels(stack(image_transform()(im) for im in images))` and
    `encode_texts(texts)` is `encode_tokens(*tokenize(texts))`: one path, whichever process preprocesses.
    """

    def image_transform(self) -> "Callable[[Image.Image], torch.Tensor]": ...

    def encode_pixels(self, pixels: torch.Tensor, device: str | torch.device = "cpu") -> ImageFeatures: ...

    def forward_pixels(self, pixels: torch.Tensor, device: str | torch.device | None = None) -> ImageFeatures: ...

    def text_transform(self) -> "Callable[[Sequence[str]], tuple[torch.Tensor, torch.Tensor]]": ...

    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]: ...

    def encode_tokens(self, ids: torch.Tensor, mask: torch.Tensor, device: str | torch.device = "cpu"
                      ) -> TextFeatures: ...


def has_pixel_path(backbone: object) -> bool:
    """True if `backbone` preprocesses apart from encoding (`PixelBackbone`); a plain `Backbone` (a test's stub)
    is given decoded images and texts as before."""
    return all(callable(getattr(backbone, name, None))
               for name in ("image_transform", "encode_pixels", "text_transform", "tokenize", "encode_tokens"))


def to_backbone_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` on `device`, copied without blocking (asynchronous from a pinned CPU batch, which the loaders make on
    CUDA: `foco.corpora.loader.make_loader`); a tensor already there is returned as it is."""
    return t if t.device == device else t.to(device, non_blocking=True)


def cut_to_longest(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) ids and mask of right-padded texts cut to the batch's longest text (at least one position), as a
    tokenizer with `padding=True` gives them. Only a CPU mask is read (no device sync): one elsewhere is kept."""
    if mask.device.type != "cpu" or mask.ndim != 2 or mask.shape[1] == 0:
        return ids, mask
    longest = max(1, int(mask.sum(1).max())) if mask.shape[0] else 1
    return ids[:, :longest], mask[:, :longest]
