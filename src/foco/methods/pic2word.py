"""Pic2Word (Saito et al., CVPR 2023): an image becomes a pseudo word in the text tower's token-embedding space.

A mapping network phi (3 linear layers, as the paper's IM2TEXT) takes the image's global feature v to a token
embedding s = phi(v). It is trained on images alone: the text feature of "a photo of *" with * = s must retrieve
its own image among the batch, with the symmetric contrastive loss

    L = CE(tau^-1 * V T^T, I) / 2 + CE(tau^-1 * T V^T, I) / 2,     T_b = f_text("a photo of *" | * = phi(v_b)),

with the frozen towers and the backbone's own temperature tau. At query time the composed query is the text
feature of a template such as "a photo of * that {modification}" with * = phi(v_reference).

Because the query needs the text tower (not cached text features), `Pic2WordMethod.needs_backbone` is True and
queries come from `encode_raw(reference_global, modification_texts, backbone)`; see `foco.methods.raw`.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..backbones.pseudo import PseudoTokenBackbone
from ..model.encoder import ComposedQuery
from ..utils.checkpoint import has_training_state, load_training_state, save_training_state
from ..utils.io import atomic_write_bytes, atomic_write_text, read_json
from ..utils.progress import Bar

log = logging.getLogger(__name__)
WEIGHTS, CONFIG = "pic2word.safetensors", "pic2word.json"


@dataclass
class Pic2WordConfig:
    image_dim: int = 256  # D, the backbone's joint space (set from the image features)
    token_dim: int = 384  # E, the text tower's token-embedding width (set from the backbone)
    hidden_dim: int = 512  # width of the two hidden layers (the paper's middle_dim)
    dropout: float = 0.1
    train_prompt: str = "a photo of *"  # the text the pseudo word is trained in
    query_template: str = "a photo of * that {}"  # {} = the modification text
    placeholder: str = "*"  # the word replaced by the pseudo token; must be one token, spaces around it


@dataclass
class Pic2WordTrainConfig:
    epochs: int = 5
    batch_size: int = 128
    lr: float = 1e-4  # the paper's
    weight_decay: float = 0.1  # the paper's
    warmup_frac: float = 0.05
    grad_clip: float = 1.0
    temperature: float | None = None  # tau of the loss; None: the backbone's own learned one (CLIP's ~0.01)
    max_steps: int | None = None  # stop early (smoke tests)
    seed: int = 0
    model: Pic2WordConfig = field(default_factory=Pic2WordConfig)


class Pic2WordMapper(nn.Module):
    """phi: (B, D) image global features -> (B, E) pseudo-token embeddings. Linear-Dropout-ReLU twice, then Linear."""

    def __init__(self, cfg: Pic2WordConfig):
        super().__init__()
        self.cfg = cfg
        layers: list[nn.Module] = []
        dim = cfg.image_dim
        for _ in range(2):
            layers += [nn.Linear(dim, cfg.hidden_dim), nn.Dropout(cfg.dropout), nn.ReLU()]
            dim = cfg.hidden_dim
        layers.append(nn.Linear(dim, cfg.token_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, image_global: torch.Tensor) -> torch.Tensor:
        return self.net(image_global)  # (B, E)

    def save(self, path: str | Path, meta: dict | None = None) -> None:
        from safetensors.torch import save as st_save
        path = Path(path)
        atomic_write_bytes(path / WEIGHTS, st_save({k: v.detach().cpu().contiguous()
                                                    for k, v in self.state_dict().items()}))
        atomic_write_text(path / CONFIG, json.dumps({"model": "pic2word", "config": asdict(self.cfg), **(meta or {})},
                                                    indent=2) + "\n")

    @staticmethod
    def load(path: str | Path) -> "Pic2WordMapper":
        from safetensors.torch import load_file
        path = Path(path)
        meta = read_json(path / CONFIG)
        if meta.get("model") != "pic2word":
            raise ValueError(f"{path / CONFIG} is not a Pic2Word checkpoint config")
        mapper = Pic2WordMapper(Pic2WordConfig(**meta["config"]))
        mapper.load_state_dict(load_file(str(path / WEIGHTS)))
        return mapper.eval()


def backbone_temperature(backbone: object) -> float:
    """The backbone's learned contrastive temperature (1 / exp(logit_scale)), or 0.07 when it has none."""
    scale = getattr(getattr(backbone, "model", None), "logit_scale", None)
    return float(1.0 / scale.detach().exp().clamp(max=100.0)) if scale is not None else 0.07


def pic2word_loss(image_global: torch.Tensor, text_global: torch.Tensor, temperature: float) -> torch.Tensor:
    """Symmetric InfoNCE between B images and the B texts built from their pseudo words; both (B, D) normalised."""
    logits = image_global @ text_global.t() / temperature  # (B, B)
    labels = torch.arange(logits.shape[0])
    return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))


def _lr_factor(step: int, total: int, warmup_frac: float) -> float:
    warm = max(1, int(total * warmup_frac))
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def train_pic2word(image_global: torch.Tensor, backbone: PseudoTokenBackbone, out: str | Path,
                   cfg: Pic2WordTrainConfig | None = None, resume: bool = False) -> Pic2WordMapper:
    """Trains phi on N cached image globals (N, D) with the frozen `backbone`'s text tower; writes `out`/
    pic2word.safetensors + pic2word.json and train_log.jsonl. The state is saved after every epoch; `resume=True`
    continues a killed run. `cfg` is not modified (the dimensions are set on a copy)."""
    cfg = copy.deepcopy(cfg) if cfg is not None else Pic2WordTrainConfig()
    out = Path(out)
    state_dir = out / "train_state"
    if has_training_state(state_dir) and not resume:
        raise FileExistsError(f"{out} holds a training run; resume it or choose another output folder")
    cfg.model.image_dim, cfg.model.token_dim = int(image_global.shape[1]), int(backbone.token_dim)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    mapper = Pic2WordMapper(cfg.model)
    opt = torch.optim.AdamW(mapper.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    tau = cfg.temperature if cfg.temperature is not None else backbone_temperature(backbone)
    n, B = image_global.shape[0], min(cfg.batch_size, image_global.shape[0])
    steps_per_epoch = n // B
    total = cfg.epochs * steps_per_epoch if cfg.max_steps is None else min(cfg.max_steps, cfg.epochs * steps_per_epoch)
    start_epoch = 0
    if resume and has_training_state(state_dir):
        start_epoch = int(load_training_state(state_dir, mapper, opt, rng)["epoch"])
    out.mkdir(parents=True, exist_ok=True)
    prompts = [cfg.model.train_prompt] * B
    step, t0 = start_epoch * steps_per_epoch, time.time()
    for epoch in range(start_epoch, cfg.epochs):
        if step >= total:
            break
        mapper.train()
        perm = torch.from_numpy(rng.permutation(n))
        loss_sum, done = 0.0, 0
        with Bar(min(steps_per_epoch, total - step), f"Pic2Word epoch {epoch + 1}/{cfg.epochs}") as bar:
            for s in range(steps_per_epoch):
                if step >= total:
                    break
                for g in opt.param_groups:
                    g["lr"] = cfg.lr * _lr_factor(step, total, cfg.warmup_frac)
                v = image_global[perm[s * B:(s + 1) * B]].float()  # (B, D)
                text = backbone.encode_texts_with_tokens(prompts, mapper(v), cfg.model.placeholder)  # (B, D)
                loss = pic2word_loss(F.normalize(v, dim=-1), text.global_, tau)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(mapper.parameters(), cfg.grad_clip)
                opt.step()
                loss_sum, done, step = loss_sum + loss.item(), done + 1, step + 1
                bar.update(1)
        rec = {"epoch": epoch + 1, "loss": loss_sum / max(1, done), "steps": step, "temperature": tau,
               "elapsed_s": round(time.time() - t0, 2)}
        log.info("Pic2Word %s", rec)
        with (out / "train_log.jsonl").open("a") as f:
            f.write(json.dumps(rec) + "\n")
        save_training_state(state_dir, mapper, opt, rng, {"epoch": epoch + 1})
    mapper.eval()
    mapper.save(out, {"backbone": backbone.spec, "train": {k: v for k, v in asdict(cfg).items() if k != "model"}})
    return mapper


class Pic2WordMethod:
    """Composed queries from a trained mapper: text feature of `query_template` with * = phi(v_reference).

    `needs_backbone = True`: call `encode_raw(reference_global, texts, backbone)`; `encode` (cached text features)
    cannot work for this method and raises.
    """

    needs_backbone = True

    def __init__(self, mapper: Pic2WordMapper, query_template: str | None = None):
        self.mapper = mapper.eval()
        self.template = query_template or mapper.cfg.query_template
        if "{}" not in self.template or mapper.cfg.placeholder not in self.template.split():
            raise ValueError(f"query template {self.template!r} needs '{{}}' and a free-standing "
                             f"{mapper.cfg.placeholder!r}")

    @classmethod
    def load(cls, path: str | Path, query_template: str | None = None) -> "Pic2WordMethod":
        return cls(Pic2WordMapper.load(path), query_template)

    def prompts(self, modifications: Sequence[str]) -> list[str]:
        return [self.template.format(m) for m in modifications]

    @torch.no_grad()
    def encode_raw(self, reference_global: torch.Tensor, modifications: Sequence[str],
                   backbone: PseudoTokenBackbone) -> ComposedQuery:
        """B reference globals (B, D) and B modification strings -> B normalised queries (B, D)."""
        if reference_global.shape[0] != len(modifications):
            raise ValueError(f"{reference_global.shape[0]} references for {len(modifications)} modifications")
        tokens = self.mapper(reference_global.float())  # (B, E)
        text = backbone.encode_texts_with_tokens(self.prompts(modifications), tokens, self.mapper.cfg.placeholder)
        return ComposedQuery(query=text.global_, attention=None, v_loc=None)

    def encode(self, reference, modification) -> ComposedQuery:
        raise TypeError("Pic2Word composes raw modification text with the backbone's text tower; call "
                        "encode_raw(reference.global_, texts, backbone) (see foco.methods.raw.compose_raw_queries)")
