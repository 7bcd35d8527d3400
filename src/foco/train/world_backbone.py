"""Contrastive pretraining of the `world` backbone on the world's `pretrain` pairs (`foco backbone train`).

The MiniLM part of the text tower is frozen, so its token states are computed once and cached; only the CNN image
tower and the small text transformer learn, with CLIP's symmetric InfoNCE loss. The result is saved as
safetensors + JSON config and is frozen from then on. Interrupted runs resume from the last finished epoch.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from .distributed import RunContext
from .harness import Plan, train_run
from .loop import Losses, LoopConfig, Phase, recorded_settings, settings_of
from ..metrics import diagonal_recalls
from ..utils.device import resolve_device, to_device
from ..utils.precision import resolve_precision
from ..utils.io import atomic_write_text, iter_batches, load_image
from ..utils.provenance import provenance
from ..utils.progress import progress
from ..world.manifest import load_pairs
from ..backbones.world import FrozenMiniLM, WorldBackbone, WorldBackboneConfig, WorldCLIP, save_world_checkpoint, uint8_to_input


@dataclass
class BackboneTrainConfig:
    epochs: int = 6
    batch_size: int = 256
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_frac: float = 0.05
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "auto"  # foco.utils.device: "auto", "cpu", "cuda", "cuda:N"
    allow_changed: tuple[str, ...] = ()  # settings `--resume` may change (`--allow-changed`); recorded
    threads: int | None = None  # torch intra-op threads; None keeps torch's default
    precision: str = "fp32"  # "bf16": each step's forward pass under bf16 autocast; "auto": bf16 where native
    model: WorldBackboneConfig = field(default_factory=WorldBackboneConfig)


def load_split_arrays(world: Path, split: str, image_size: int) -> tuple[list[str], torch.Tensor, list[str]]:
    """Ids, (N, S, S, 3) uint8 images and captions of a pairs split."""
    pairs = load_pairs(world, split)
    imgs = np.empty((len(pairs), image_size, image_size, 3), dtype=np.uint8)
    for i, p in enumerate(progress(pairs, desc=f"loading {split} images")):
        im = load_image(p.image)
        if im.size != (image_size, image_size):
            im = im.resize((image_size, image_size))
        imgs[i] = np.asarray(im)
    return [p.id for p in pairs], torch.from_numpy(imgs), [p.caption for p in pairs]


def encode_minilm(minilm: FrozenMiniLM, texts: list[str], cache: Path, batch_size: int = 256
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, L, 384) float16 states and (N, L) masks of the frozen encoder, cached in `cache`."""
    from safetensors.torch import load_file, save_file
    if cache.is_file():
        t = load_file(str(cache))
        if t["states"].shape[0] == len(texts):
            return t["states"], t["mask"]
    L = minilm.max_len
    states = torch.zeros(len(texts), L, 384, dtype=torch.float16)
    mask = torch.zeros(len(texts), L, dtype=torch.bool)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths batch together
    for idx in progress(list(iter_batches(order, batch_size)), desc="frozen text encoder"):
        s, m = minilm([texts[i] for i in idx])
        states[idx, : s.shape[1]] = s.half().cpu()
        mask[idx, : m.shape[1]] = m.cpu()
    used = int(mask.any(0).nonzero().max()) + 1
    states, mask = states[:, :used].contiguous(), mask[:, :used].contiguous()
    cache.parent.mkdir(parents=True, exist_ok=True)
    save_file({"states": states, "mask": mask}, str(cache))
    return states, mask


def clip_loss(img: torch.Tensor, txt: torch.Tensor, logit_scale: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE over a batch of B matched pairs; img, txt (B, D) normalised."""
    logits = logit_scale.exp().clamp(max=100) * img @ txt.t()  # (B, B)
    labels = torch.arange(img.shape[0], device=img.device)
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        skip = p.ndim < 2 or name.endswith("pos") or "position_embedding" in name or "logit_scale" in name
        (no_decay if skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def evaluate_backbone(backbone: WorldBackbone, world: Path, split: str = "backbone_val", batch_size: int = 256
                      ) -> dict[str, float]:
    """Caption -> image and image -> caption recall on a held-out pairs split, through the public encode API."""
    pairs = load_pairs(world, split)
    img, txt = [], []
    for batch in iter_batches(pairs, batch_size):
        img.append(backbone.encode_images([load_image(p.image) for p in batch]).global_)
        txt.append(backbone.encode_texts([p.caption for p in batch]).global_)
    scores = torch.cat(txt) @ torch.cat(img).t()  # (N captions, N images)
    t2i = diagonal_recalls(scores, (1, 5, 10))
    i2t = diagonal_recalls(scores.t().contiguous(), (1, 5, 10))
    return {"n": len(pairs), **{f"caption->image {k}": v for k, v in t2i.items()},
            **{f"image->caption {k}": v for k, v in i2t.items()}}


def _clip_step(model: WorldCLIP, images: torch.Tensor, states: torch.Tensor, mask: torch.Tensor,
               device: str = "cpu") -> Callable[[torch.Tensor], Losses]:
    """The step on a batch of pairs: images (N, S, S, 3) uint8, frozen text states (N, L, 384), masks (N, L), held
    on the CPU; each batch is copied to `device`."""
    def step(idx: torch.Tensor) -> Losses:  # idx (B,)
        x = uint8_to_input(to_device(images[idx], device))  # (B, 3, S, S)
        m = mask[idx]
        used = int(m.any(0).nonzero().max()) + 1
        img_g, _ = model.image(x)  # (B, D)
        txt_g, _ = model.text(to_device(states[idx, :used].float(), device), to_device(m[:, :used], device))  # (B, D)
        return {"loss": clip_loss(F.normalize(img_g, dim=-1), F.normalize(txt_g, dim=-1), model.logit_scale)}
    return step


def _world_record(world: Path) -> dict:
    """What the backbone was pretrained on: the world's config (its pretraining split's size and, since issue 56,
    its marks) and the marks' realised shares, from world.json."""
    from ..records import read
    rec = read("world.json", world / "world.json")
    return {"world_config": rec["config"], **({"pretrain_mark_shares": rec["pretrain_marks"]}
                                              if "pretrain_marks" in rec else {})}


def train_world_backbone(world: str | Path, out: str | Path, cfg: BackboneTrainConfig = BackboneTrainConfig(),
                         resume: bool = True) -> dict:
    """Trains, saves to `out` (model.safetensors + config.json), evaluates on backbone_val; returns the metrics.
    `resume=False` starts over even where `out` holds a run. One process (not data-parallel) on `cfg.device`."""
    world, out = Path(world), Path(out)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.time()
    ctx = RunContext(device=str(resolve_device(cfg.device))).for_run(cfg.seed, out)
    result = {}

    def build(ctx: RunContext) -> Plan:
        device = ctx.device
        model = WorldCLIP(cfg.model).to(device)  # initialised on the CPU (the same weights everywhere), then moved
        minilm = FrozenMiniLM(cfg.model.text_encoder, cfg.model.max_text_len).to(device)
        _, images, captions = load_split_arrays(world, "pretrain", cfg.model.image_size)
        states, mask = encode_minilm(minilm, captions, out / "cache" / "pretrain_minilm.safetensors")
        n = images.shape[0]
        if n < cfg.batch_size:
            raise ValueError(f"pretrain split has {n} pairs, fewer than one batch of {cfg.batch_size}")
        opt = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.98))
        phase = Phase(cfg.epochs, lambda: opt, _clip_step(model, images, states, mask, device),
                      record=lambda _: {"lr": opt.param_groups[0]["lr"]}, clip_params=model.parameters)  # model order
        loop = LoopConfig(n, cfg.batch_size, cfg.warmup_frac, cfg.grad_clip, name="backbone",
                          settings=settings_of(cfg), precision=resolve_precision(cfg.precision, device),
                          allow_changed=frozenset(cfg.allow_changed))

        def save(history: dict) -> None:
            train_s = time.time() - t0
            backbone = WorldBackbone(model, str(out), device)
            metrics = result["metrics"] = {**evaluate_backbone(backbone, world), "train_seconds": round(train_s, 1)}
            save_world_checkpoint(model, out, extra={**recorded_settings(history), "precision": cfg.precision,
                                                      "world": str(Path(world).resolve()), **_world_record(world),
                                                      "metrics": metrics, "provenance": provenance()})
            atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
        return Plan(model, [phase], loop, save)
    train_run(ctx, build, resume, refuse=False)
    return result["metrics"]
