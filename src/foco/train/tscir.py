"""TSCIR, from mapping to composing (seeds/tscir-mapping-to-composing.txt), in two stages.

Stage 1, mapping: a mapper with visual semantic injection (`foco.methods.composer.VSIMapper`: the global feature's
pseudo token attends over the patch features) is trained on the corpus images with the frozen text tower:

    L_map  = Pic2Word's symmetric InfoNCE between the images v and f_text("a photo of *" | * = phi(v, patches))
    L_soft = KL(p_b || q_b), the soft text alignment: p_b = softmax_j(c_b . c_j / tau_s) over the batch's captions
             (a caption's similarity to the others), q_b = softmax_j(t_b . c_j / tau) for the pseudo-word prompt t_b;
             the prompt is pulled towards its image's caption, softly, near-duplicate captions sharing the mass
    loss   = L_map + soft_weight L_soft

Stage 2, composing: the mapper is frozen and the text tower's trainable part (LoRA on hf, the TextHead copy on the
world) is tuned on synthetic triplets (reference, instruction, target image). The target images are not rendered:
each ITT triplet's target caption is retrieved among the corpus images with a similarity threshold
(`foco.train.targets`), and triplets without an image above it are dropped; `max_triplets` keeps "a small amount".

    L_comp = symmetric InfoNCE between q = f_text~("a photo of * that {instruction}" | phi(v)) and the target images

The seed names the modules and objectives but not their forms; the forms above are the choices, and `soft_weight`
and the threshold are options.

Data-parallel under torchrun (`foco.train.distributed`): each rank takes B/N rows of the global batch; captions and
target images are cached features, gathered without gradient; the pseudo-word texts and the queries come out of
the trained composer and are gathered with it. Each stage wraps the composer in DDP when it starts, after choosing
which parameters train.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..utils.device import move

from ..backbones.tunable import TextTuneConfig
from ..methods.composer import TextComposer
from ..methods.pic2word import Pic2WordConfig
from .edit_data import EditTable
from .distributed import DistEnv, RunContext, context, data_parallel, rank_slice
from .harness import Plan, train_run
from .loop import RUN_ONLY, Losses, LoopConfig, Phase, recorded_settings, settings_of
from .losses import compose_loss
from .pact import build_composer
from .pic2word import backbone_temperature, pic2word_loss
from .targets import TargetMatch


@dataclass
class TSCIRTrainConfig:
    stage1_epochs: int = 3
    stage2_epochs: int = 3
    batch_size: int = 128
    lr_stage1: float = 1e-4  # the mapper (Pic2Word's)
    lr_stage2: float = 1e-5  # the text tower's trainable part
    weight_decay: float = 0.01
    warmup_frac: float = 0.05
    grad_clip: float = 1.0
    soft_weight: float = 1.0  # L_soft
    soft_temperature: float = 0.05  # tau_s of the caption-caption soft labels
    threshold: float | str = "auto"  # target-image retrieval (`foco.train.targets`)
    max_triplets: int | None = None  # None: every triplet that kept a target image
    temperature: float | None = None  # None: the backbone's own
    max_steps: int | None = None
    seed: int = 0
    device: str | None = None  # "auto", "cpu", "cuda", "cuda:N" (foco.utils.device); None: the process group's (`context`)
    allow_changed: tuple[str, ...] = ()  # settings `--resume` may change (`--allow-changed`); recorded
    model: Pic2WordConfig = field(default_factory=Pic2WordConfig)
    text: TextTuneConfig = field(default_factory=TextTuneConfig)


def soft_alignment(prompt: torch.Tensor, caption: torch.Tensor, temperature: float, soft_temperature: float,
                   env=None) -> torch.Tensor:
    """KL(p || q) averaged over the batch; prompt and caption (B, D) normalised (module docstring).

    Data-parallel (`env`), the rows are this rank's: every row's distributions run over the global batch's captions
    (cached features, gathered without gradient), and the rank's mean over its rows is its share of the global
    mean."""
    from .distributed import gather_rows
    keys = gather_rows(caption, env) if env is not None and env.enabled else caption  # (B, D)
    p = F.softmax(caption @ keys.t() / soft_temperature, dim=1)  # (b, B)
    log_q = F.log_softmax(prompt @ keys.t() / temperature, dim=1)  # (b, B)
    return F.kl_div(log_q, p, reduction="batchmean")


@dataclass
class MappingData:
    """Stage 1's examples: each source image once, with its caption."""

    images: torch.Tensor  # (N, D) normalised globals
    patches: torch.Tensor  # (N, P, D) storage dtype
    captions: torch.Tensor  # (Nt, D) normalised text globals
    image_rows: torch.Tensor  # (S,) long
    caption_rows: torch.Tensor  # (S,) long: the caption of each

    def __len__(self) -> int:
        return self.image_rows.shape[0]


def mapping_losses(composer: TextComposer, data: MappingData, idx: torch.Tensor, cfg: TSCIRTrainConfig, tau: float,
                   env: DistEnv = DistEnv()) -> Losses:
    """L_map + soft_weight L_soft on the examples `idx` (B,), the global batch; data-parallel, this rank's B/N."""
    mine = rank_slice(idx, env)  # (b,)
    rows = data.image_rows[mine]
    v, patches = move(data.images[rows], env.device), move(data.patches[rows].float(), env.device)  # (b, D), (b, P, D)
    c = move(data.captions[data.caption_rows[mine]], env.device)  # (b, D)
    t = composer.text(composer.prompts(None, len(mine)), composer.mapper(v, patches), composer.cfg.placeholder)
    out = {"map": pic2word_loss(v, t, tau, env)}
    if cfg.soft_weight > 0:
        out["soft"] = soft_alignment(t, c, tau, cfg.soft_temperature, env)
    out["loss"] = out["map"] + cfg.soft_weight * out.get("soft", 0.0)
    return out


def composing_losses(composer: TextComposer, kept: EditTable, idx: torch.Tensor, tau: float,
                     env: DistEnv = DistEnv()) -> Losses:
    """L_comp on the synthetic triplets `idx` (B,), the global batch; data-parallel, this rank's B/N."""
    b = move(kept.batch(rank_slice(idx, env)), env.device)
    q = composer(b.reference.global_, b.reference.patches, b.texts)  # (b, D)
    return {"loss": compose_loss(q, b.target_image, None, None, tau, env)}


def train_tscir(edits: EditTable, backbone, out: str | Path, cfg: TSCIRTrainConfig | None = None,
                resume: bool = False, meta: dict | None = None,
                ctx: RunContext | None = None) -> tuple[TextComposer, TargetMatch]:
    """Trains both stages; writes `out`/composer.json, mapper.safetensors, text.safetensors, targets.json (which
    triplets kept which image), the log and the loss curve. Resumable after every epoch. `ctx`: the run's ranks and
    device (None: this process on `cfg.device`)."""
    cfg = cfg or TSCIRTrainConfig()
    ctx = (ctx or context(cfg.device)).for_run(cfg.seed, out)
    found = {}

    def build(env: RunContext) -> Plan:
        composer = build_composer("tscir", "vsi", cfg.model, cfg.text, backbone, int(edits.image_global.shape[1]),
                                  patch_dim=int(edits.patches.shape[-1]))
        tau = cfg.temperature if cfg.temperature is not None else backbone_temperature(backbone)
        images = F.normalize(edits.image_global.float(), dim=-1)  # (N, D)
        captions = F.normalize(edits.text_global.float(), dim=-1)  # (Nt, D)
        # stage 1 data: each source image once, with its caption
        first = {}
        for s, c in zip(edits.source.tolist(), edits.source_caption.tolist()):
            first.setdefault(s, c)
        data = MappingData(images, edits.patches, captions, torch.tensor(list(first), device="cpu"),
                           torch.tensor(list(first.values()), device="cpu"))  # CPU rows: each batch moves its own
        # stage 2 data: triplets with a retrieved target image
        targeted, match = edits.with_targets(cfg.threshold)
        found["match"] = match
        kept = targeted.subset(match.kept)
        if cfg.max_triplets is not None and len(kept) > cfg.max_triplets:
            pick = torch.from_numpy(np.random.default_rng(cfg.seed).permutation(len(kept))[:cfg.max_triplets])
            mask = torch.zeros(len(kept), dtype=torch.bool, device="cpu")  # selects rows of a CPU table
            mask[pick] = True
            kept = kept.subset(mask)
        if len(kept) < 2:
            raise ValueError(f"{match.summary()}: too few synthetic triplets for stage 2; lower --target-threshold")
        composer.to(env.device)
        objective = {}  # the phase's DDP wrapper: the stages train different parts, so each wraps its own

        def mapping(idx: torch.Tensor) -> Losses:  # idx (B,) rows of the mapping data, the global batch
            return objective["ddp"](lambda: mapping_losses(composer, data, idx, cfg, tau, env))

        def composing(idx: torch.Tensor) -> Losses:  # idx (B,) rows of kept, the global batch
            return objective["ddp"](lambda: composing_losses(composer, kept, idx, tau, env))

        def stage1_opt() -> torch.optim.AdamW:
            composer.text.requires_grad_(False)  # the frozen text tower: only the mapper learns to map
            objective["ddp"] = data_parallel(composer, env)
            return torch.optim.AdamW(composer.mapper.parameters(), lr=cfg.lr_stage1, weight_decay=cfg.weight_decay)

        def stage2_opt() -> torch.optim.AdamW:
            composer.mapper.requires_grad_(False)
            for name, p in composer.text.named_parameters():
                p.requires_grad_(composer.text.cfg.kind == "world-head" or "lora_" in name)
            objective["ddp"] = data_parallel(composer, env)
            return torch.optim.AdamW([p for p in composer.text.parameters() if p.requires_grad], lr=cfg.lr_stage2,
                                     weight_decay=cfg.weight_decay)

        phases = [Phase(cfg.stage1_epochs, stage1_opt, mapping, tag={"stage": "mapping"}, n=len(data)),
                  Phase(cfg.stage2_epochs, stage2_opt, composing, tag={"stage": "composing"}, n=len(kept))]
        loop = LoopConfig(len(kept), min(cfg.batch_size, len(kept), len(data)), cfg.warmup_frac, cfg.grad_clip,
                          cfg.max_steps, name="TSCIR", plot_keys=("map", "soft", "loss"),
                          plot_title="TSCIR training losses per step (mapping, then composing)",
                          identity={"backbone": backbone.spec},
                          settings=settings_of(cfg, RUN_ONLY | {"model", "text"}),  # sized by build_composer
                          allow_changed=frozenset(cfg.allow_changed))
        return Plan(composer, phases, loop, lambda history: composer.save(
            env.out, {"backbone": backbone.spec, "temperature": tau,
                      "targets": {"threshold": match.threshold, "triplets": len(edits),
                                  "with_target": int(match.kept.sum()), "trained_on": len(kept)},
                      **recorded_settings(history), **(meta or {})}))
    composer = train_run(ctx, build, resume).model
    return composer, found["match"]
