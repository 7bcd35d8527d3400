"""Training Context-I2W's mapper (`foco context-i2w train`): cached image tokens, each image's caption with its
subject masked as the context, the frozen text tower, Pic2Word's symmetric loss on "a photo of *" (src/trainer.py's
get_loss_img2text_replace_token; `foco.methods.context_i2w` describes the mapper).

The reference's recipe, kept: AdamW lr 5e-4 (ViT-L/14), betas (0.9, 0.98), eps 1e-6, weight decay 0.2 except on
parameters whose names hold "bn", "ln", "bias" or "logit_scale"; a linear warm-up of 10,000 steps, then cosine to 0
over the run (open_clip's cosine_lr, stepped every batch; a run shorter than the warm-up never leaves it); batch 64,
32 epochs, no clipping, the backbone's own temperature (CLIP's 1/100), the mapper's dropout 0.1 on.

The context (`mask_subject`): the caption with its subject's noun replaced by the placeholder. The release has no
masking script (its `csv_replace_key` column is undefined); foco takes the subject from the caption's
decomposition: the last word of its first local phrase ("a large red circle" -> "circle"), replaced where it first
occurs as a word. With `add_decompositions` (the +AD control, as the paper runs it on Context-I2W), each
decomposition pair rejoined into a sentence (`foco.train.lincir.rejoin`) is one more training pair of the same image,
its local phrase's noun masked.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from ..backbones.pseudo import PseudoTokenBackbone
from ..methods.context_i2w import ContextI2WConfig, ContextI2WMapper, image_tokens, raw_text
from .distributed import DistEnv, RunContext, context, ddp, rank_slice
from .harness import Plan, check_out, train_run
from .loop import Losses, LoopConfig, Phase, recorded_settings, settings_of
from .pic2word import backbone_temperature, pic2word_loss


@dataclass
class ContextI2WTrainConfig:
    epochs: int = 32
    batch_size: int = 64
    lr: float = 5e-4
    weight_decay: float = 0.2
    warmup_steps: int = 10000
    temperature: float | None = None  # None: the backbone's learned one
    max_steps: int | None = None
    seed: int = 0
    device: str | None = None
    allow_changed: tuple[str, ...] = ()
    model: ContextI2WConfig = field(default_factory=ContextI2WConfig)


def no_decay(name: str) -> bool:
    """main.py's exclusion from weight decay, by name alone."""
    return any(k in name for k in ("bn", "ln", "bias", "logit_scale"))


def make_optimizer(mapper: torch.nn.Module, cfg: ContextI2WTrainConfig) -> torch.optim.Optimizer:
    named = [(n, p) for n, p in mapper.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if no_decay(n)], "weight_decay": 0.0},
              {"params": [p for n, p in named if not no_decay(n)], "weight_decay": cfg.weight_decay}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), eps=1e-6)


def mask_subject(caption: str, local: str | None, placeholder: str = "*") -> str:
    """`caption` with the noun of `local` (its last word) replaced by the placeholder where it first occurs as a
    word; "a photo of *" when there is no such word."""
    noun = local.split()[-1] if local and local.split() else None
    if noun:
        masked, n = re.subn(rf"\b{re.escape(noun)}\b", f" {placeholder} ", caption, count=1)
        if n:
            return " ".join(masked.split())
    return f"a photo of {placeholder}"


def context_pairs(world: str | Path, split: str = "train", add_decompositions: bool = False,
                  placeholder: str = "*") -> tuple[list[str], list[str]]:
    """(image ids, masked contexts) of a world's `split` pairs; with `add_decompositions`, each caption's
    decomposition pairs rejoined follow, each with its image's id."""
    from ..world.manifest import load_pairs
    from .lincir import rejoin
    ids, texts = [], []
    pairs = load_pairs(world, split)
    for p in pairs:
        first = p.decomposition.pairs[0].local if p.decomposition.pairs else None
        ids.append(p.id)
        texts.append(mask_subject(p.caption, first, placeholder))
    if add_decompositions:
        for p in pairs:
            for pair in p.decomposition.pairs:
                ids.append(p.id)
                texts.append(mask_subject(rejoin(pair.local, pair.context), pair.local, placeholder))
    return ids, texts


class ContextI2WObjective(torch.nn.Module):
    """The loss as a module's forward (for DDP): the mapper is trained, the text tower frozen and held outside."""

    def __init__(self, mapper: ContextI2WMapper, backbone: PseudoTokenBackbone, tau: float):
        super().__init__()
        self.mapper, self.tau = mapper, tau
        self.__dict__["backbone"] = backbone

    def forward(self, c: torch.Tensor, x: torch.Tensor, v: torch.Tensor, env: DistEnv) -> Losses:
        """c (b, E) contexts; x (b, 1+N, D) image tokens; v (b, D) the images' normalised globals."""
        cfg = self.mapper.cfg
        tokens = self.mapper(c, x)  # (b, O)
        text = self.backbone.encode_texts_with_tokens([cfg.train_prompt] * x.shape[0], tokens,
                                                      cfg.placeholder).global_  # (b, D)
        return {"loss": pic2word_loss(F.normalize(v.float(), dim=-1), text, self.tau, env)}


def train_context_i2w(cache_ids: Sequence[str], images, pair_ids: Sequence[str], contexts: Sequence[str],
                      backbone: PseudoTokenBackbone, out: str | Path, cfg: ContextI2WTrainConfig | None = None,
                      resume: bool = False, meta: dict | None = None, ctx: RunContext | None = None
                      ) -> ContextI2WMapper:
    """Trains the mapper on M (image, context) pairs: `pair_ids` (M,) name rows of the cache (`cache_ids`, and
    `images`, its ImageFeatures with globals, norms and patches); `contexts` (M,) the masked texts. Writes `out`/
    context_i2w.safetensors + context_i2w.json and the training log; resumable."""
    cfg = cfg if cfg is not None else ContextI2WTrainConfig()
    if not contexts or len(contexts) != len(pair_ids):
        raise ValueError(f"{len(pair_ids)} images for {len(contexts)} contexts")
    where = {k: i for i, k in enumerate(cache_ids)}
    missing = [k for k in pair_ids if k not in where]
    if missing:
        raise ValueError(f"{len(missing)} training image(s) are not in the feature cache, e.g. {missing[0]!r}: "
                         "give the cache of the same world split (--features)")
    image_tokens(images.global_[:1], images.norm[:1] if images.norm is not None else None,
                 images.patches[:1] if images.patches is not None else None, "the training features")  # refuses
    cfg = replace(cfg, model=replace(cfg.model, image_dim=int(images.patches.shape[-1]),
                                     context_dim=int(backbone.embed_dim), token_dim=int(backbone.token_dim)))
    ctx = (ctx or context(cfg.device)).for_run(cfg.seed, out)
    check_out(ctx, resume)
    rows = torch.tensor([where[k] for k in pair_ids])  # (M,)

    def build(env: RunContext) -> Plan:
        mapper = ContextI2WMapper(cfg.model).to(env.device)
        tau = cfg.temperature if cfg.temperature is not None else backbone_temperature(backbone)
        with torch.no_grad():
            c_all = torch.cat([raw_text(backbone, contexts[i:i + 256]) for i in range(0, len(contexts), 256)])
        objective = ContextI2WObjective(mapper, backbone, tau)
        if env.enabled:
            objective = ddp(objective, env, find_unused=False)

        def step(idx: torch.Tensor) -> Losses:  # idx (B,) the global batch of pairs; each rank takes its rows
            mine = rank_slice(idx, env).cpu()
            r = rows[mine]
            x = image_tokens(images.global_[r], images.norm[r], images.patches[r], "the training features")
            return objective(c_all[mine].to(env.device), x.to(env.device), images.global_[r].to(env.device), env)

        M, B = len(pair_ids), min(cfg.batch_size, len(pair_ids))
        # the loop warms up int(steps * frac) steps: + 0.5 keeps exactly `warmup_steps`
        steps = (M // B) * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, (M // B) * cfg.epochs)
        loop = LoopConfig(M, B, warmup_frac=(cfg.warmup_steps + 0.5) / max(1, steps), grad_clip=0.0,
                          max_steps=cfg.max_steps, name="Context-I2W", identity={"backbone": backbone.spec},
                          settings=settings_of(cfg), allow_changed=frozenset(cfg.allow_changed))
        return Plan(mapper, [Phase(cfg.epochs, lambda: make_optimizer(mapper, cfg), step,
                                   record=lambda s: {"local_gate": float(mapper.local_gate.detach().tanh())})],
                    loop, lambda history: mapper.save(env.out, {"backbone": backbone.spec, "pairs": M,
                                                                **recorded_settings(history), **(meta or {})}))
    return train_run(ctx, build, resume).model
