"""`HFBackbone`: a frozen Hugging Face `transformers` CLIP or SigLIP model as a FoCo `Backbone`.

The checkpoint is loaded with `from_pretrained` from a local directory (strictly offline:
``local_files_only=True``) or from a hub id, which transformers resolves through the user's HF cache (set
``HF_HUB_OFFLINE=1`` to forbid any network access). Preprocessing uses the checkpoint's own image processor
(the PIL/numpy backend; torchvision is never required) and tokenizer, loaded separately with
`AutoImageProcessor` and `AutoTokenizer` so that checkpoints whose processor class cannot be assembled by
`AutoProcessor` still work.

How every feature is put into the joint space of dimension D, per family
(B = batch, P = number of patches, L = token positions, W = encoder width):

CLIP (`CLIPModel`; D = ``projection_dim``)
    * image global  = ``visual_projection(post_layernorm(h[:, 0]))``, L2-normalised, where ``h`` is the vision
      encoder's ``last_hidden_state`` (B, 1 + P, W); this equals ``model.get_image_features``.
    * image patches = ``visual_projection(post_layernorm(h[:, 1:]))`` (B, P, D): the CLS token's projection
      applied to every patch token; not normalised.
    * text tokens   = ``text_projection(t)`` (B, L, D), where ``t`` is the text model's ``last_hidden_state``
      (already passed through ``final_layer_norm``); not normalised.
    * text global   = ``text_projection(pooler_output)`` (the EOS token), L2-normalised; this equals
      ``model.get_text_features``.
    * texts are padded to the longest text in the batch (truncated at ``max_position_embeddings``) and the
      attention mask is given to the model; mask = ``attention_mask.bool()``.

SigLIP (`SiglipModel`; D = vision ``hidden_size``, which equals the text head's ``projection_size``)
    * image global  = the vision ``pooler_output`` (the multi-head attention-pooling "MAP" head), normalised;
      this equals ``model.get_image_features``.
    * image patches = the vision ``last_hidden_state`` (B, P, D) (already ``post_layernorm``-ed, and as wide as
      the embedding space); SigLIP has no CLS token and no projection after the MAP head, so no further
      projection is applied; not normalised.
    * text tokens   = ``text_model.head(t)`` (B, L, D), where ``t`` is the text ``last_hidden_state`` (already
      ``final_layer_norm``-ed): the pooled token's linear head applied to every token; not normalised.
    * text global   = the text ``pooler_output`` = ``head(t[:, -1])`` (the last position), normalised; this
      equals ``model.get_text_features``.
    * texts are padded with ``padding="max_length"`` to ``max_position_embeddings`` as SigLIP was trained, and
      — again as trained, and as the stock SigLIP tokenizer does — only ``input_ids`` are given to the model
      (no attention mask: padding positions are attended and the global is read at the last, usually padding,
      position). The returned mask marks the real tokens: the tokenizer's attention mask (requested
      explicitly), else ``input_ids != pad_token_id``.

SigLIP 2 (``model_type == "siglip2"``, variable-resolution NaFlex inputs) is not supported and raises
`ValueError`; fixed-resolution SigLIP 2 checkpoints published with a ``siglip`` config load as SigLIP.
"""
from __future__ import annotations

import functools
import hashlib

import importlib.util
import os
from typing import Sequence

import torch
import torch.nn.functional as F
from PIL import Image

from .base import ImageFeatures, TextFeatures, cut_to_longest, to_backbone_device
from .pseudo import placeholder_slots, single_token_id

_CLIP = "clip"
_SIGLIP = "siglip"
_SUPPORTED = (_CLIP, _SIGLIP)


def _looks_local(name_or_path: str) -> bool:
    """True if `name_or_path` is written like a filesystem path rather than a hub id.

    Hub ids are ``name`` or ``org/name`` (at most one ``/``, no leading ``.``, ``/`` or ``~``), so a string
    starting with ``.``, ``/`` or ``~``, containing a non-``/`` path separator, or holding two or more ``/``
    is a local path.
    """
    if name_or_path.startswith((".", "/", "~")):
        return True
    if os.sep != "/" and os.sep in name_or_path:
        return True
    return name_or_path.count("/") >= 2


def _pooled(output: object) -> torch.Tensor:
    """The embedding tensor of `get_image_features`/`get_text_features`, whichever form transformers returns.

    transformers 4.x returns a tensor; 5.x returns a `BaseModelOutputWithPooling` whose `pooler_output` holds it.
    """
    if isinstance(output, torch.Tensor):
        return output
    pooled = getattr(output, "pooler_output", None)
    if pooled is None:
        pooled = output[1]  # type: ignore[index]  # tuple form: (last_hidden_state, pooler_output, ...)
    return pooled


def _needs_torchvision(processor: object) -> bool:
    """True if `processor` is a torchvision-backed ("fast") image processor."""
    if getattr(processor, "is_fast", False) or type(processor).__name__.endswith("Fast"):
        return True
    try:
        from transformers.image_processing_backends import TorchvisionBackend
    except ImportError:  # older transformers: fast processors are flagged by `is_fast` / the name
        return False
    return isinstance(processor, TorchvisionBackend)


def clip_vit_read(vision_model: torch.nn.Module, projection: torch.nn.Module, hidden: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """How foco reads a CLIP ViT: the vision encoder's last hidden state (B, 1 + P, W) through its final norm and
    the visual projection; the class token is the global (B, D, raw: equal to `get_image_features`) and the patch
    tokens, through the same norm and projection, are the patches (B, P, D). The world's ViT backbone
    (`foco.backbones.world`, image_tower "vit") reads its tower with this same function."""
    projected = projection(vision_model.post_layernorm(hidden))  # (B, 1 + P, D)
    return projected[:, 0], projected[:, 1:]


class HFBackbone:
    """A frozen transformers CLIP or SigLIP model exposing FoCo's `Backbone` protocol.

    See the module docstring for exactly how image patches and text tokens are projected into the joint
    space for each family. The caller passes one batch per call; there is no internal batching.

    Args:
        name_or_path: A local checkpoint directory (loaded with ``local_files_only=True``) or a hub id
            (resolved by transformers, e.g. from the user's HF cache).
        device: Device the model runs on. Returned features are always on the CPU.
        dtype: Dtype of the model weights. Returned features are always float32.

    Attributes:
        embed_dim: D, the dimension of the joint image-text embedding space.
        num_patches: P, ``(image_size // patch_size) ** 2`` patch tokens per image.
        family: ``"clip"`` or ``"siglip"``.
        model: The underlying `CLIPModel` or `SiglipModel`, in eval mode with gradients disabled.
        image_processor: The checkpoint's image processor.
        tokenizer: The checkpoint's tokenizer.

    Raises:
        FileNotFoundError: If `name_or_path` is not an existing directory but looks like a local path (starts
            with ``.``, ``/`` or ``~``, or has two or more ``/``; a single ``org/name`` is taken as a hub id).
        ValueError: If the checkpoint's model type is neither CLIP nor SigLIP.
    """

    text_tuning = "lora"  # LoRA on its text encoder (`foco.backbones.tunable`)

    def __init__(
        self,
        name_or_path: str,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        from transformers import AutoConfig, AutoTokenizer, CLIPModel, SiglipModel

        is_dir = os.path.isdir(os.path.expanduser(name_or_path))
        # a local checkpoint is recorded resolved, so that a spec written here works from any folder
        self.name_or_path = os.path.realpath(os.path.expanduser(name_or_path)) if is_dir else name_or_path
        if not is_dir and _looks_local(name_or_path):
            raise FileNotFoundError(f"HFBackbone: checkpoint directory not found: {name_or_path!r}")
        load_kw = {"local_files_only": True} if is_dir else {}
        source = os.path.expanduser(name_or_path) if is_dir else name_or_path

        config = AutoConfig.from_pretrained(source, **load_kw)
        model_type = getattr(config, "model_type", None)
        if model_type not in _SUPPORTED:
            raise ValueError(
                f"HFBackbone: {name_or_path!r} has model_type {model_type!r}; only CLIP ('clip') and "
                f"SigLIP ('siglip') checkpoints are supported"
            )
        if model_type == _SIGLIP and not getattr(config.vision_config, "vision_use_head", True):
            raise ValueError(
                f"HFBackbone: SigLIP checkpoint {name_or_path!r} has no vision pooling head "
                f"(vision_use_head=False), so it has no image global feature"
            )
        self.family: str = model_type
        self.device = torch.device(device)
        self.dtype = dtype

        model_cls = CLIPModel if model_type == _CLIP else SiglipModel
        self.model = model_cls.from_pretrained(source, config=config, dtype=dtype, **load_kw)
        self.model.to(self.device).eval().requires_grad_(False)

        self.image_processor = self._load_image_processor(source, load_kw)
        self.tokenizer = AutoTokenizer.from_pretrained(source, **load_kw)

        vision = config.vision_config
        self.num_patches: int = (vision.image_size // vision.patch_size) ** 2  # P
        if model_type == _CLIP:
            self.embed_dim: int = config.projection_dim  # D
        else:
            self.embed_dim = vision.hidden_size  # D (= text projection_size)
        self._max_text_len: int = config.text_config.max_position_embeddings

    @staticmethod
    def _load_image_processor(name_or_path: str, load_kw: dict):
        """The checkpoint's image processor, on the PIL/numpy backend when torchvision is unavailable."""
        from transformers import AutoImageProcessor

        if importlib.util.find_spec("torchvision") is not None:
            return AutoImageProcessor.from_pretrained(name_or_path, **load_kw)
        try:
            # transformers 5.x picks the PIL backend by itself when torchvision is missing.
            processor = AutoImageProcessor.from_pretrained(name_or_path, **load_kw)
        except ImportError:  # a torchvision-only ("fast") processor was picked
            processor = None
        if processor is None or _needs_torchvision(processor):
            processor = AutoImageProcessor.from_pretrained(name_or_path, use_fast=False, **load_kw)
        return processor

    @property
    def spec(self) -> str:
        """The registry string that recreates this backbone."""
        return f"hf:{self.name_or_path}"

    @functools.cached_property
    def weights_sha256(self) -> str | None:
        """The sha256 over the checkpoint folder's weight files (name and bytes, in name order), recorded with what
        is made from this backbone; None for a hub id (no local file to hash)."""
        if not os.path.isdir(self.name_or_path):
            return None
        from ..utils.io import sha256_file
        files = sorted(f for f in os.listdir(self.name_or_path) if f.endswith((".safetensors", ".bin")))
        h = hashlib.sha256()
        for f in files:
            h.update(f.encode() + b"\0" + sha256_file(os.path.join(self.name_or_path, f)).encode())
        return h.hexdigest()

    # -- preprocessing apart from encoding (`foco.backbones.base.PixelBackbone`) --------------------------------

    def image_transform(self) -> "HFImageTransform":
        """A picklable callable, one PIL image -> (3, H, W) uint8: the checkpoint's processor resizing and cropping
        (rescale and normalisation are left to `encode_pixels`, on the device)."""
        return HFImageTransform(self.image_processor)

    def text_transform(self) -> "HFTextTransform":
        """A picklable callable, B texts -> input ids (B, L) int64 and the real-token mask (B, L) bool, padded to
        L = ``max_position_embeddings`` (module docstring: CLIP is cut back to the longest by `encode_tokens`)."""
        return HFTextTransform(self.tokenizer, self._max_text_len)

    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """`text_transform()(texts)`: (B, L) ids and (B, L) mask at the fixed length."""
        return HFTextTransform(self.tokenizer, self._max_text_len)(texts)

    def encode_pixels(self, pixels: torch.Tensor, device: str | torch.device = "cpu") -> ImageFeatures:
        """Encodes (B, 3, H, W) pixels of `image_transform` (uint8; float32 whole numbers from a processor that
        resizes in floats) into a normalised global (B, D) and projected patches (B, P, D), float32 on `device`.
        The pixels are copied to the model's device without blocking and rescaled and normalised there, as the
        processor would."""
        with torch.inference_mode():
            return self.forward_pixels(pixels, device)

    def forward_pixels(self, pixels: torch.Tensor, device: str | torch.device | None = None) -> ImageFeatures:
        """`encode_pixels` in the caller's grad mode (a tuned image tower trains through it, `foco.train.tat`);
        the features on `device` (None: the model's)."""
        proc = self.image_processor
        x = to_backbone_device(pixels, self.device).float()  # (B, 3, H, W)
        if getattr(proc, "do_rescale", True):
            x = x * float(getattr(proc, "rescale_factor", 1 / 255))
        if getattr(proc, "do_normalize", True):
            mean, std = self._mean_std()  # (3,), (3,) on the model's device, made once
            x = (x - mean[:, None, None]) / std[:, None, None]
        return self._encode_normalised(x.to(self.dtype), self.device if device is None else device)

    def _mean_std(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The processor's normalisation on the model's device, copied there once (a copy of a new tensor to a GPU
        waits for its queue: never once a batch)."""
        if getattr(self, "_norm", None) is None:
            proc = self.image_processor
            self._norm = (torch.tensor(proc.image_mean, dtype=torch.float32).to(self.device),
                          torch.tensor(proc.image_std, dtype=torch.float32).to(self.device))
        return self._norm

    def _encode_normalised(self, pixels: torch.Tensor, device: str | torch.device) -> ImageFeatures:
        out = self.model.vision_model(pixel_values=pixels, return_dict=True)  # pixels (B, 3, H, W)
        hidden = out.last_hidden_state  # CLIP: (B, 1 + P, W); SigLIP: (B, P, D)
        if self.family == _CLIP:
            global_, patches = clip_vit_read(self.model.vision_model, self.model.visual_projection,
                                             hidden)  # (B, D), (B, P, D)
        else:
            global_ = out.pooler_output  # (B, D), MAP head
            patches = hidden  # (B, P, D), already post_layernorm-ed
        norm = global_.float().norm(dim=-1)  # (B,) of the raw embedding (Pic2Word's mapper reads it raw)
        global_ = F.normalize(global_.float(), dim=-1)  # (B, D)
        return ImageFeatures(global_=global_.to(device), patches=patches.float().to(device), norm=norm.to(device))

    def encode_tokens(self, ids: torch.Tensor, mask: torch.Tensor, device: str | torch.device = "cpu"
                      ) -> TextFeatures:
        """Encodes (B, L) ids and mask of `text_transform` into a normalised global (B, D), projected tokens
        (B, L', D) and the mask (B, L'), on `device`. CLIP: a CPU batch is first cut to its longest text (L' as
        `encode_texts` pads); SigLIP keeps the fixed length it was trained with."""
        if self.family == _CLIP:
            ids, mask = cut_to_longest(ids, mask)  # (B, L'), (B, L')
        with torch.inference_mode():
            return self._encode_ids(ids, mask, out_device=device)

    def encode_images(self, images: Sequence[Image.Image], device: str | torch.device = "cpu") -> ImageFeatures:
        """Encodes a batch of B images into a normalised global (B, D) and projected patches (B, P, D), float32 on
        `device` (the CPU by default): `encode_pixels` of the images through `image_transform`."""
        transform = self.image_transform()
        return self.encode_pixels(torch.stack([transform(im) for im in images]), device)  # (B, 3, H, W) uint8

    def encode_texts(self, texts: Sequence[str], device: str | torch.device = "cpu") -> TextFeatures:
        """Encodes a batch of B texts into a normalised global (B, D), projected tokens (B, L, D) and a mask, on
        `device` (the CPU by default): `encode_tokens` of `tokenize(texts)`."""
        return self.encode_tokens(*self.tokenize(texts), device=device)

    # -- pseudo tokens (Pic2Word-style methods) ------------------------------------------------------------------

    @property
    def token_dim(self) -> int:
        """E, the width of the text tower's token-embedding space."""
        return int(self.model.text_model.embeddings.token_embedding.embedding_dim)

    def token_embedding(self, word: str) -> torch.Tensor:
        """(E,) the input token embedding of `word`, which must be a single token."""
        row = self.model.text_model.embeddings.token_embedding.weight[single_token_id(self.tokenizer, word)]
        return row.detach().float().cpu()

    def encode_texts_with_tokens(self, texts: Sequence[str], embeddings: torch.Tensor,
                                 placeholder: str = "*", text_model: torch.nn.Module | None = None,
                                 keep: tuple[int, int] | None = None) -> TextFeatures:
        """`encode_texts` with every `placeholder` token of text b replaced by the embedding row `embeddings[b]`.

        The replacement happens on the output of ``embeddings.token_embedding`` (a forward hook), so position
        embeddings, the attention mask and CLIP's EOS pooling (read from ``input_ids``) work as usual. Runs in the
        caller's grad mode: gradients flow to `embeddings` (B, E) through the frozen text tower. The placeholder must
        tokenize alone (put spaces around it: "a photo of * that ...").
        `text_model` replaces the backbone's own text model (a tuned copy: `foco.backbones.tunable`); the projection
        stays the backbone's.
        """
        input_ids, mask = self._tokenize(texts)  # (B, L), (B, L)
        slots = placeholder_slots(input_ids, single_token_id(self.tokenizer, placeholder), texts, placeholder,
                                  embeddings, keep).to(self.device)  # (B, L)
        emb = embeddings.to(self.device, self.dtype)  # (B, E)

        def replace(module, args, out):  # out: (B, L, E)
            return torch.where(slots[..., None], emb[:, None, :], out)

        text_model = text_model if text_model is not None else self.model.text_model
        handle = text_model.embeddings.token_embedding.register_forward_hook(replace)
        try:
            return self._encode_ids(input_ids, mask, text_model, out_device=embeddings.device)  # the caller's
        finally:
            handle.remove()

    def _tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids (B, L) and the real-token mask (B, L), padded as the family was trained (module docstring)."""
        tok = self.tokenizer
        enc = tok(
            list(texts),
            padding=True if self.family == _CLIP else "max_length",
            truncation=True,
            max_length=self._max_text_len,
            return_attention_mask=True,
            return_tensors="pt",
        )
        input_ids = enc["input_ids"]  # (B, L)
        if enc.get("attention_mask") is not None:
            mask = enc["attention_mask"].bool()  # (B, L)
        else:
            mask = input_ids != tok.pad_token_id  # (B, L)
        return input_ids, mask

    def _encode_ids(self, input_ids: torch.Tensor, mask: torch.Tensor,
                    text_model: torch.nn.Module | None = None, out_device: str | torch.device = "cpu"
                    ) -> TextFeatures:
        input_ids = to_backbone_device(input_ids, self.device)  # (B, L)
        text_model = text_model if text_model is not None else self.model.text_model
        if self.family == _CLIP:
            out = text_model(input_ids=input_ids, attention_mask=to_backbone_device(mask, self.device).long(),
                             return_dict=True)
            hidden = out.last_hidden_state  # (B, L, W), final_layer_norm-ed
            tokens = self.model.text_projection(hidden)  # (B, L, D)
            global_ = self.model.text_projection(out.pooler_output)  # (B, D), EOS token
        else:
            out = text_model(input_ids=input_ids, return_dict=True)  # no mask, as SigLIP was trained
            hidden = out.last_hidden_state  # (B, L, W), final_layer_norm-ed
            tokens = text_model.head(hidden)  # (B, L, D)
            global_ = out.pooler_output  # (B, D) = head(hidden[:, -1])
        norm = global_.float().norm(dim=-1)  # (B,) the raw global's norm
        global_ = F.normalize(global_.float(), dim=-1)  # (B, D)
        return TextFeatures(global_=global_.to(out_device), tokens=tokens.float().to(out_device),
                            mask=mask.to(out_device), norm=norm.to(out_device))


class HFImageTransform:
    """One PIL image -> (3, H, W) uint8: the checkpoint's image processor with its rescale and normalisation left
    out (its resize, crop and padding give whole numbers; `HFBackbone.encode_pixels` rescales and normalises on the
    device). Picklable: DataLoader workers run it (`foco.corpora.loader`).

    The plain CLIP and SigLIP recipes of the PIL backend (resize to a shortest edge or to height x width with PIL,
    then a centre crop that fits) are done here with PIL directly, as the processor does them, without its
    per-call overhead (`tests/test_input_pipeline.py` checks the bytes are the processor's); anything else (a crop
    larger than the image, padding, a torchvision processor) calls the processor."""

    def __init__(self, processor) -> None:
        self.processor = processor
        self.plan = _pil_plan(processor)  # None: always call the processor

    def __call__(self, image: Image.Image) -> torch.Tensor:
        import numpy as np
        rgb = image.convert("RGB")
        if self.plan is not None:
            out = _pil_transform(rgb, self.plan)
            if out is not None:
                return out
        arr = self.processor(images=[rgb], do_rescale=False, do_normalize=False,
                             return_tensors="np")["pixel_values"][0]  # (3, H, W)
        if arr.dtype != np.uint8:  # a processor that resizes in floats: keep them (exact, 4x the bytes)
            return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))
        return torch.from_numpy(np.ascontiguousarray(arr))  # (3, H, W) uint8


def _field(size, key: str):
    """A size's field, from transformers 5's `SizeDict` or 4.x's dict."""
    return size.get(key) if isinstance(size, dict) else getattr(size, key, None)


def _pil_plan(processor) -> dict | None:
    """What the PIL backend's processor does to an image, where it is a plain resize + centre crop: {"resize":
    ("shortest", s) | ("exact", h, w) | None, "crop": (h, w) | None, "resample": int}; None otherwise."""
    if _needs_torchvision(processor) or getattr(processor, "do_pad", False):
        return None
    plan: dict = {"resize": None, "crop": None, "resample": getattr(processor, "resample", None)}
    if plan["resample"] is None:
        return None
    plan["resample"] = int(plan["resample"])
    size = getattr(processor, "size", None)
    others = ("longest_edge", "max_height", "max_width", "min_pixels", "max_pixels")
    if getattr(processor, "do_resize", False):
        if size is None or any(_field(size, k) for k in others):
            return None
        if _field(size, "shortest_edge") and not (_field(size, "height") or _field(size, "width")):
            plan["resize"] = ("shortest", int(_field(size, "shortest_edge")))
        elif _field(size, "height") and _field(size, "width") and not _field(size, "shortest_edge"):
            plan["resize"] = ("exact", int(_field(size, "height")), int(_field(size, "width")))
        else:
            return None
    if getattr(processor, "do_center_crop", False):
        crop = getattr(processor, "crop_size", None)
        if crop is None or not (_field(crop, "height") and _field(crop, "width")):
            return None
        plan["crop"] = (int(_field(crop, "height")), int(_field(crop, "width")))
    return plan


def _pil_transform(rgb: Image.Image, plan: dict) -> torch.Tensor | None:
    """`plan` on an RGB image: (3, H, W) uint8, or None where the processor must do it (a crop needing padding)."""
    import numpy as np
    if plan["resize"] is not None:
        w, h = rgb.size
        if plan["resize"][0] == "shortest":  # transformers' get_resize_output_image_size(default_to_square=False)
            s = plan["resize"][1]
            short, long = (w, h) if w <= h else (h, w)
            new_long = int(s * long / short)
            nw, nh = (s, new_long) if w <= h else (new_long, s)
        else:
            nh, nw = plan["resize"][1], plan["resize"][2]
        rgb = rgb.resize((nw, nh), resample=plan["resample"], reducing_gap=None)
    arr = np.asarray(rgb)  # (H, W, 3) uint8
    if plan["crop"] is not None:
        ch, cw = plan["crop"]
        top, left = (arr.shape[0] - ch) // 2, (arr.shape[1] - cw) // 2
        if top < 0 or left < 0:
            return None
        arr = arr[top:top + ch, left:left + cw]
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))  # (3, H, W) uint8


class HFTextTransform:
    """B texts -> input ids (B, L) int64 and the real-token mask (B, L) bool, padded to the fixed L = `max_length`
    (mask: the tokenizer's attention mask, else ids != pad). Picklable: DataLoader workers run it."""

    def __init__(self, tokenizer, max_length: int) -> None:
        self.tokenizer, self.max_length = tokenizer, int(max_length)

    def __call__(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        tok = self.tokenizer
        enc = tok(list(texts), padding="max_length", truncation=True, max_length=self.max_length,
                  return_attention_mask=True, return_tensors="pt")
        input_ids = enc["input_ids"].long()  # (B, L)
        if enc.get("attention_mask") is not None:
            mask = enc["attention_mask"].bool()  # (B, L)
        else:
            mask = input_ids != tok.pad_token_id  # (B, L)
        return input_ids, mask
