"""Training Pic2Word's mapping network phi (`foco pic2word train`): images alone, the frozen text tower, the
symmetric contrastive loss of `foco.methods.pic2word` on "a photo of *"."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..backbones.pseudo import PseudoTokenBackbone
from ..methods.pic2word import Pic2WordConfig, Pic2WordMapper, mapper_input
from .distributed import DistEnv, RunContext, context, ddp, rank_slice
from .harness import Plan, train_run
from .loop import Losses, LoopConfig, Phase, recorded_settings, settings_of


@dataclass
class Pic2WordTrainConfig:
    epochs: int = 5
    batch_size: int = 128
    lr: float = 1e-4  # the paper's
    weight_decay: float = 0.1  # the paper's
    warmup_frac: float = 0.05
    grad_clip: float = 1.0
    optimizer: str = "reference"  # OPTIMIZERS: "reference" (Pic2Word's trainer) or "adamw" (torch's defaults)
    temperature: float | None = None  # tau of the loss; None: the backbone's own learned one (CLIP's ~0.01)
    max_steps: int | None = None  # stop early (smoke tests)
    seed: int = 0
    device: str | None = None  # "auto", "cpu", "cuda", "cuda:N" (foco.utils.device); None: the process group's (`context`)
    allow_changed: tuple[str, ...] = ()  # settings `--resume` may change (`--allow-changed`); recorded
    model: Pic2WordConfig = field(default_factory=Pic2WordConfig)


OPTIMIZERS = ("reference", "adamw")


def no_decay(name: str, param: torch.nn.Parameter) -> bool:
    """The reference trainer's exclusion from weight decay: biases, norms' gains (BatchNorm, LayerNorm) and the
    temperature, i.e. every parameter whose name says so or that has fewer than two dimensions."""
    return param.ndim < 2 or any(k in name for k in ("bias", "bn", "ln", "norm", "logit_scale"))


def make_optimizer(module: torch.nn.Module, cfg: "Pic2WordTrainConfig") -> torch.optim.Optimizer:
    """`reference`: AdamW with betas (0.9, 0.98), eps 1e-6 and no decay on biases and norms, as Pic2Word's trainer
    (google-research/composed_image_retrieval) builds it; `adamw`: torch's AdamW defaults (betas (0.9, 0.999),
    eps 1e-8), decay on every parameter, as foco trained Pic2Word before."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW([p for _, p in named], lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer != "reference":
        raise ValueError(f"--optimizer {cfg.optimizer!r}: choose from {', '.join(OPTIMIZERS)}")
    groups = [{"params": [p for n, p in named if no_decay(n, p)], "weight_decay": 0.0},
              {"params": [p for n, p in named if not no_decay(n, p)], "weight_decay": cfg.weight_decay}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), eps=1e-6)


def backbone_temperature(backbone: object) -> float:
    """The backbone's learned contrastive temperature (1 / exp(logit_scale)), or 0.07 when it has none."""
    scale = getattr(getattr(backbone, "model", None), "logit_scale", None)
    return float(1.0 / scale.detach().exp().clamp(max=100.0)) if scale is not None else 0.07


def pic2word_loss(image_global: torch.Tensor, text_global: torch.Tensor, temperature: float, env=None
                  ) -> torch.Tensor:
    """Symmetric InfoNCE between B images and the B texts built from their pseudo words; both (B, D) normalised.

    Data-parallel (`env`), the rows are this rank's: the images (cached features) are gathered without gradient,
    the texts (out of the trained mapper) with it. Each rank returns its rows' share of the global mean, so that
    DDP's average over ranks is the one-process gradient; ranks may hold different row counts."""
    if env is None or not env.enabled:
        logits = image_global @ text_global.t() / temperature  # (B, B)
        labels = torch.arange(logits.shape[0], device=logits.device)
        return 0.5 * (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels))
    from .distributed import gather_rows, gather_with_grad, row_offset, total_across
    b = image_global.shape[0]
    texts, images = gather_with_grad(text_global, env), gather_rows(image_global, env)  # (B, D) each
    labels = torch.arange(b, device=image_global.device) + row_offset(b, env)
    total = 0.5 * (F.cross_entropy(image_global @ texts.t() / temperature, labels, reduction="sum") +
                   F.cross_entropy(text_global @ images.t() / temperature, labels, reduction="sum"))
    return total * env.world_size / total_across(b, env) + 0.0 * texts.sum()  # joins the graph when b = 0


class Pic2WordObjective(torch.nn.Module):
    """Pic2Word's loss as a module's forward, for DDP. Data-parallel, each rank maps its b images and scores its
    rows against the images and texts of the whole batch: the images are gathered without gradient (cached
    features), the texts with it (`torch.distributed.nn`), because they come out of the trained mapper. The
    gather's backward sends each rank the gradient of every rank's loss with respect to its texts, and DDP averages
    the mapper's gradients over ranks: together that is the gradient of the global batch's mean loss, as on one
    process (open_clip's local loss with gathered features)."""

    def __init__(self, mapper: Pic2WordMapper, backbone: PseudoTokenBackbone, prompt: str, placeholder: str,
                 tau: float):
        super().__init__()
        self.mapper = mapper
        self.__dict__["backbone"] = backbone  # frozen: not a submodule, so DDP leaves it alone
        self.prompt, self.placeholder, self.tau = prompt, placeholder, tau

    def forward(self, x: torch.Tensor, v: torch.Tensor, env: DistEnv) -> Losses:
        """x (b, D) this rank's mapper inputs (raw or normalised); v (b, D) the same images' normalised globals."""
        text = self.backbone.encode_texts_with_tokens([self.prompt] * x.shape[0], self.mapper(x),
                                                      self.placeholder).global_  # (b, D)
        return {"loss": pic2word_loss(F.normalize(v, dim=-1), text, self.tau, env)}


def train_pic2word(image_global: torch.Tensor, backbone: PseudoTokenBackbone, out: str | Path,
                   cfg: Pic2WordTrainConfig | None = None, resume: bool = False, meta: dict | None = None,
                   image_norm: torch.Tensor | None = None, ctx: RunContext | None = None) -> Pic2WordMapper:
    """Trains phi on N cached image globals (N, D), normalised, with the frozen `backbone`'s text tower; a mapper
    with raw input (`Pic2WordConfig.mapper_input`, the default) reads them times `image_norm` (N,). Writes `out`/
    pic2word.safetensors + pic2word.json and train_log.jsonl. The state is saved after every epoch; `resume=True`
    continues a killed run. `cfg` is not modified (the dimensions are set on a copy). `ctx`: the run's ranks and
    device (None: this process on `cfg.device`)."""
    cfg = cfg if cfg is not None else Pic2WordTrainConfig()
    cfg = replace(cfg, model=replace(cfg.model, image_dim=int(image_global.shape[1]),
                                     token_dim=int(backbone.token_dim)))
    ctx = (ctx or context(cfg.device)).for_run(cfg.seed, out)

    def build(ctx: RunContext) -> Plan:
        mapper = Pic2WordMapper(cfg.model)
        tau = cfg.temperature if cfg.temperature is not None else backbone_temperature(backbone)
        n, B = image_global.shape[0], min(cfg.batch_size, image_global.shape[0])
        mapper.to(ctx.device)
        inputs = mapper_input(image_global, image_norm, cfg.model.mapper_input, "the training features")  # (N, D)
        images = image_global.to(ctx.device)  # (N, D): globals only, normalised (the loss's images)
        inputs = inputs.to(ctx.device)
        objective = Pic2WordObjective(mapper, backbone, cfg.model.train_prompt, cfg.model.placeholder, tau)
        if ctx.enabled:
            objective = ddp(objective, ctx, find_unused=False)

        def step(idx: torch.Tensor) -> Losses:  # idx (B,), the global batch; each rank takes its rows
            rows = rank_slice(idx, ctx).to(ctx.device)
            return objective(inputs[rows].float(), images[rows].float(), ctx)

        phase = Phase(cfg.epochs, lambda: make_optimizer(mapper, cfg), step,
                      record=lambda steps: {"steps": steps, "temperature": tau})
        loop = LoopConfig(n, B, cfg.warmup_frac, cfg.grad_clip, cfg.max_steps, name="Pic2Word",
                          identity={"backbone": backbone.spec}, settings=settings_of(cfg),
                          allow_changed=frozenset(cfg.allow_changed))
        return Plan(mapper, [phase], loop, lambda history: mapper.save(
            ctx.out, {"backbone": backbone.spec, **recorded_settings(history), **(meta or {})}))
    return train_run(ctx, build, resume).model
