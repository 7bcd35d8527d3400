"""PACT, Preserve-and-Compose Training (seeds/pact-chord.txt), on ITT triplets: source image, instruction, target
caption, negative captions; no target image.

The composed query q = f_text~("a photo of * that {instruction}" | * = phi(v_source)) comes from a Pic2Word-style
mapper phi and the text tower with its trainable part tuned (`foco.backbones.tunable`: LoRA on an hf text tower, a
copy of the TextHead for the world backbone). The targets (captions, negatives) and the gallery stay in the frozen
backbone's space.

    L_compose  = symmetric InfoNCE of q against the batch's target captions, each query's negative captions
                 (the edit not applied, applied to the wrong phrase, ...) joining its candidates
    L_preserve = the identity objective replayed on the batch's source images: f_text~("a photo of *" | phi(v))
                 must retrieve v among them (Pic2Word's loss, through the tuned tower), so that tuning for
                 composition keeps the source evidence the pseudo word carries
    L_visual   = InfoNCE of q against the source images (the seed's "L_compose + alpha L_visual" row)
    loss = compose_weight L_compose + preserve_weight L_preserve + visual_weight L_visual

The seed gives the objectives' roles, the ablation rows (compose only, preserve only, compose + alpha visual, full)
and the schedule (appendix Table 5), not their formulas. The choices made here:
* the schedule is the seed's: identity updates train the mapper alone (the warm-up, Pic2Word's objective on the
  corpus images, lr 1e-4), then joint updates train the mapper and the text tower's trainable part (lr 3e-5 and
  1e-5, weight decay 1e-3); a trained Pic2Word mapper can replace the warm-up (`mapper_init`);
* L_preserve is the identity replay above (the seed's "replay microbatch"), L_visual is optional (`visual_weight`,
  0 by default, as in the full model);
* the temperature is the backbone's own (CLIP's learned one), as Pic2Word's.
Chord scoring (`foco eval --chord`) applies at inference, as the seed does.

Data-parallel under torchrun (`foco.train.distributed`): each rank takes B/N triplets (or images) of the global
batch. The targets, negatives and images are cached features, gathered without gradient; the queries and the
pseudo-word texts come out of the trained composer and are gathered with it. L_preserve's distinct source images
are those of the global batch, split over the ranks.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..utils.device import move

from ..backbones.tunable import TextTuneConfig, tunable_text
from ..methods.composer import TextComposer, build_mapper
from ..methods.pic2word import Pic2WordConfig, Pic2WordMapper
from .edit_data import EditTable
from .distributed import DistEnv, RunContext, context, data_parallel, rank_chunk, rank_slice
from .harness import Plan, train_run
from .loop import RUN_ONLY, Losses, LoopConfig, Phase, recorded_settings, settings_of
from .losses import compose_loss, info_nce
from .pic2word import backbone_temperature, pic2word_loss


@dataclass
class PACTTrainConfig:
    identity_epochs: int = 1  # warm-up: the mapper alone on the corpus images (0 with mapper_init)
    joint_epochs: int = 3  # mapper + text tower on the triplets
    batch_size: int = 128  # the seed's composition / preservation batches are 512 / 512
    lr_warmup: float = 1e-4  # the seed's
    lr_mapper: float = 3e-5  # the seed's joint mapper lr
    lr_text: float = 1e-5  # the seed's text LoRA lr
    weight_decay: float = 1e-3  # the seed's
    warmup_frac: float = 0.05
    grad_clip: float = 1.0
    compose_weight: float = 1.0  # 0: "L_preserve only"
    preserve_weight: float = 1.0  # 0: "L_compose only"
    visual_weight: float = 0.0  # alpha of L_visual
    negatives: bool = True  # negative captions as hard negatives in L_compose
    temperature: float | None = None  # None: the backbone's own
    mapper_init: str | None = None  # a Pic2Word checkpoint folder to start the mapper from
    max_steps: int | None = None
    seed: int = 0
    device: str | None = None  # "auto", "cpu", "cuda", "cuda:N" (foco.utils.device); None: the process group's (`context`)
    allow_changed: tuple[str, ...] = ()  # settings `--resume` may change (`--allow-changed`); recorded
    model: Pic2WordConfig = field(default_factory=Pic2WordConfig)
    text: TextTuneConfig = field(default_factory=TextTuneConfig)


def build_composer(method: str, mapper_kind: str, model_cfg: Pic2WordConfig, text_cfg: TextTuneConfig, backbone,
                   image_dim: int, mapper_init: str | None = None, patch_dim: int | None = None) -> TextComposer:
    """A fresh composer: its mapper (`mapper_kind`) sized to the features and the backbone, optionally started from
    a Pic2Word checkpoint, and the backbone's tunable text part."""
    cfg = replace(model_cfg, image_dim=image_dim, token_dim=int(backbone.token_dim))
    if mapper_kind == "vsi":
        from ..methods.composer import VSIConfig
        cfg = VSIConfig(**{**asdict(cfg), "patch_dim": patch_dim or image_dim})
    mapper = build_mapper(mapper_kind, cfg)
    if mapper_init is not None:
        init = Pic2WordMapper.load(mapper_init)
        if init.cfg.mapper_input != "normalized":
            raise ValueError(f"--mapper-init {mapper_init}: that Pic2Word mapper reads the raw image embedding, and "
                             f"{method.upper()} feeds it the normalised one; train it with `foco pic2word train "
                             "--mapper-input normalized`")
        if (init.cfg.image_dim, init.cfg.token_dim, init.cfg.hidden_dim) != (cfg.image_dim, cfg.token_dim,
                                                                              cfg.hidden_dim):
            raise ValueError(f"--mapper-init {mapper_init}: its mapper is {init.cfg.image_dim} -> "
                             f"{init.cfg.token_dim} (hidden {init.cfg.hidden_dim}), this one {cfg.image_dim} -> "
                             f"{cfg.token_dim} (hidden {cfg.hidden_dim})")
        mapper.base.load_state_dict(init.state_dict())
    return TextComposer(method, mapper_kind, mapper, tunable_text(backbone, text_cfg))


def identity_losses(composer: TextComposer, images: torch.Tensor, idx: torch.Tensor, tau: float,
                    env: DistEnv = DistEnv()) -> Losses:
    """The warm-up: Pic2Word's objective on the images `idx` (B,) of `images` (N, D) normalised. Data-parallel,
    this rank's B/N rows against the global batch."""
    v = images[rank_slice(idx, env).to(images.device)]  # (b, D)
    return {"loss": pic2word_loss(v, composer(v, None, None), tau, env)}


def joint_losses(composer: TextComposer, edits: EditTable, images: torch.Tensor, idx: torch.Tensor,
                 cfg: PACTTrainConfig, tau: float, env: DistEnv = DistEnv()) -> Losses:
    """L_compose, L_preserve and L_visual (module docstring) of the triplets `idx` (B,), the global batch;
    data-parallel, this rank's B/N triplets, and its part of the global batch's distinct source images."""
    b = move(edits.batch(rank_slice(idx, env)), images.device)  # this rank's b triplets, on the model's device
    v = F.normalize(b.reference.global_, dim=-1)  # (b, D)
    out: Losses = {}
    loss = torch.zeros((), device=v.device)
    if cfg.compose_weight > 0 or cfg.visual_weight > 0:
        q = composer(v, None, b.texts)  # (b, D)
        if cfg.compose_weight > 0:
            out["compose"] = compose_loss(q, b.target, b.negatives if cfg.negatives else None, b.negative_mask, tau,
                                          env)
            loss = loss + cfg.compose_weight * out["compose"]
        if cfg.visual_weight > 0:
            out["visual"] = info_nce(q, v, tau, env)
            loss = loss + cfg.visual_weight * out["visual"]
    if cfg.preserve_weight > 0:
        # the global batch's distinct source images, split over the ranks (their count need not divide)
        rows = rank_chunk(torch.unique(edits.source[idx]), env)
        u = images[rows.to(images.device)]  # (U_r, D)
        out["preserve"] = pic2word_loss(u, composer(u, None, None), tau, env)
        loss = loss + cfg.preserve_weight * out["preserve"]
    out["loss"] = loss
    return out


def train_pact(edits: EditTable, backbone, out: str | Path, cfg: PACTTrainConfig | None = None,
               resume: bool = False, meta: dict | None = None, ctx: RunContext | None = None) -> TextComposer:
    """Trains PACT on the triplets of `edits` with `backbone`'s text tower; writes `out`/composer.json,
    mapper.safetensors, text.safetensors, the log and the loss curve. Resumable after every epoch. `ctx`: the run's
    ranks and device (None: this process on `cfg.device`)."""
    cfg = cfg or PACTTrainConfig()
    if cfg.compose_weight <= 0 and cfg.preserve_weight <= 0 and cfg.visual_weight <= 0:
        raise ValueError("every PACT loss weight is 0: nothing to train")
    ctx = (ctx or context(cfg.device)).for_run(cfg.seed, out)

    def build(env: RunContext) -> Plan:
        composer = build_composer("pact", "pic2word", cfg.model, cfg.text, backbone, int(edits.image_global.shape[1]),
                                  cfg.mapper_init)
        tau = cfg.temperature if cfg.temperature is not None else backbone_temperature(backbone)
        composer.to(env.device)
        images = F.normalize(edits.image_global.float(), dim=-1).to(env.device)  # (N, D)
        n_images = images.shape[0]
        objective = data_parallel(composer, env)  # both phases train the mapper and the tower's trainable part

        def identity(idx: torch.Tensor) -> Losses:  # idx (B,) image rows, the global batch
            return objective(lambda: identity_losses(composer, images, idx, tau, env))

        def joint(idx: torch.Tensor) -> Losses:  # idx (B,) triplet rows, the global batch
            return objective(lambda: joint_losses(composer, edits, images, idx, cfg, tau, env))

        def joint_optimizer() -> torch.optim.AdamW:
            return torch.optim.AdamW([{"params": list(composer.mapper.parameters()), "lr": cfg.lr_mapper},
                                      {"params": [p for p in composer.text.parameters() if p.requires_grad],
                                       "lr": cfg.lr_text}], weight_decay=cfg.weight_decay)

        phases = []
        if cfg.identity_epochs > 0:
            phases.append(Phase(cfg.identity_epochs, lambda: torch.optim.AdamW(composer.mapper.parameters(),
                                                                                lr=cfg.lr_warmup,
                                                                                weight_decay=cfg.weight_decay),
                                identity, tag={"stage": "identity"}, n=n_images))
        phases.append(Phase(cfg.joint_epochs, joint_optimizer, joint, tag={"stage": "joint"}, n=len(edits)))
        loop = LoopConfig(len(edits), min(cfg.batch_size, len(edits), n_images), cfg.warmup_frac, cfg.grad_clip,
                          cfg.max_steps, name="PACT", plot_keys=("compose", "preserve", "visual"),
                          plot_title="PACT training losses per step (identity warm-up, then joint)",
                          identity={"backbone": backbone.spec},
                          settings=settings_of(cfg, RUN_ONLY | {"model", "text"}),  # sized by build_composer
                          allow_changed=frozenset(cfg.allow_changed))
        return Plan(composer, phases, loop, lambda history: composer.save(
            env.out, {"backbone": backbone.spec, "temperature": tau, **recorded_settings(history), **(meta or {})}))
    return train_run(ctx, build, resume).model
