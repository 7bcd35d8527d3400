"""Training AdaFocal (`foco adafocal train`): FoCo's composed-query encoder, plus CAAM for the "caam" variant,
trained supervised on OACIR quadruples (reference, modification text, box, target) with the sigmoid contrastive
loss of experiments/supervised_ceiling.py: h(reference, T_m, box) against every target global of the batch, its
own target the positive and the batch's other targets the negatives. One phase on the project's harness
(`foco.train.harness`): seeded, resumable, progress and log as every trainer."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..backbones.base import ImageFeatures, TextFeatures
from ..methods.adafocal import AdaFocalConfig, AdaFocalModel
from ..model.caam import CAAMConfig
from ..model.encoder import FoCoConfig
from ..utils.device import to_device
from .distributed import RunContext, context
from .harness import Plan, train_run
from .loop import Losses, LoopConfig, Phase, recorded_settings, settings_of


@dataclass
class Quadruples:
    """N OACIR training examples as cached features (every tensor on one device, the CPU by default)."""

    ref_global: torch.Tensor  # (N, D) the references' normalised globals
    ref_patches: torch.Tensor  # (N, P, D) their patch features
    text: TextFeatures  # (N, D), (N, L, D), (N, L): the modification texts
    box_mask: torch.Tensor  # (N, P) bool, the patches inside each query's box (all False: no box)
    target_global: torch.Tensor  # (N, D) the targets' normalised globals
    instance_ids: list[str]  # (N,) the preserved instance of each query
    hard: torch.Tensor | None = None  # (N, M, D) each query's own hard negatives (its subset's other images)
    hard_mask: torch.Tensor | None = None  # (N, M) bool, the real ones among them (rows are padded to M)

    def __post_init__(self) -> None:
        N, P, D = self.ref_patches.shape
        shapes = {"ref_global": (self.ref_global.shape, (N, D)), "box_mask": (self.box_mask.shape, (N, P)),
                  "target_global": (self.target_global.shape, (N, D)),
                  "text.global_": (self.text.global_.shape, (N, D)),
                  "text.tokens": (self.text.tokens.shape[::2], (N, D)),
                  "text.mask": (self.text.mask.shape[:1], (N,))}
        bad = [f"{k} {tuple(got)} (want {want})" for k, (got, want) in shapes.items() if tuple(got) != want]
        if bad or len(self.instance_ids) != N:
            raise ValueError(f"quadruples of {N} examples, {P} patches, D {D} disagree: {', '.join(bad)}"
                             f"{'' if len(self.instance_ids) == N else f', {len(self.instance_ids)} instance ids'}")
        if self.box_mask.dtype != torch.bool:
            raise ValueError(f"box_mask must be bool, got {self.box_mask.dtype}")
        if (self.hard is None) != (self.hard_mask is None) or (self.hard is not None and (
                self.hard.shape[0] != N or self.hard.shape[2] != D or self.hard_mask.shape != self.hard.shape[:2])):
            raise ValueError("hard negatives need (N, M, D) features and an (N, M) mask, or neither")

    def __len__(self) -> int:
        return self.ref_global.shape[0]

    def batch(self, rows: torch.Tensor, device: torch.device | str
              ) -> tuple[ImageFeatures, TextFeatures, torch.Tensor, torch.Tensor]:
        """Rows (b,) -> (reference, modification, box (b, P), target (b, D)), on `device`."""
        rows = rows.to(self.ref_global.device)
        t = self.text
        on = lambda x: to_device(x[rows], device)  # noqa: E731  pinned, non-blocking onto a GPU; cast there
        ref = ImageFeatures(on(self.ref_global).float(), on(self.ref_patches).float())
        mod = TextFeatures(on(t.global_).float(), on(t.tokens).float(), on(t.mask))
        return ref, mod, on(self.box_mask), on(self.target_global).float()

    def hard_batch(self, rows: torch.Tensor, device: torch.device | str
                   ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Rows (b,) -> their hard negatives (b, M, D) and mask (b, M) on `device`; None without any."""
        if self.hard is None:
            return None
        rows = rows.to(self.hard.device)
        return to_device(self.hard[rows], device).float(), to_device(self.hard_mask[rows], device)


@dataclass
class AdaFocalTrainConfig:
    variant: str = "caam"  # "caam" (AdaFocal), "none" (the baseline without CAAM), "fixed" (foco's fixed beta)
    caam: CAAMConfig = field(default_factory=CAAMConfig)  # its dim is set from the features
    foco: FoCoConfig = field(default_factory=lambda: FoCoConfig(learn_bias=True))  # dim set from the features
    fixed_beta: float = 0.0  # the "fixed" variant's beta (chosen on val by the caller)
    epochs: int = 8
    batch_size: int = 128
    lr: float = 3e-4  # supervised_ceiling.py's
    weight_decay: float = 0.05
    warmup_frac: float = 0.05
    grad_clip: float = 1.0
    max_steps: int | None = None  # stop early (smoke tests)
    hard_negatives: bool = True  # each query's own subset (instance and context distractors) among its negatives
    seed: int = 0
    device: str | None = None  # "auto", "cpu", "cuda", "cuda:N"; None: the process's (`context`)
    allow_changed: tuple[str, ...] = ()  # settings a resumed run may change (`--allow-changed`); recorded

    def model_config(self, dim: int) -> AdaFocalConfig:
        return AdaFocalConfig(self.variant, replace(self.foco, dim=dim), replace(self.caam, dim=dim),
                              self.fixed_beta).check()


def sigmoid_loss(model: AdaFocalModel, query: torch.Tensor, target: torch.Tensor,
                 hard: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Queries (B, D) against the batch's targets (B, D), both normalised: the mean over queries of the summed
    sigmoid losses, +1 for a query's own target, -1 for the batch's others (supervised_ceiling.py), and -1 for each
    of the query's own hard negatives (`hard`: (B, M, D) and their (B, M) mask) when given: OACIR's distractors,
    the same instance in another context and another instance in the target's context, which a batch of random
    queries almost never holds."""
    enc = model.encoder
    scale = enc.log_scale_comp.exp().clamp(max=100)
    logits = scale * query @ target.T + enc.bias_comp  # (B, B)
    B = logits.shape[0]
    labels = 2 * torch.eye(B, dtype=logits.dtype, device=logits.device) - 1  # (B, B)
    loss = -F.logsigmoid(labels * logits).sum(1)  # (B,)
    if hard is not None:
        feats, mask = hard  # (B, M, D), (B, M)
        hard_logits = scale * torch.einsum("bd,bmd->bm", query, feats) + enc.bias_comp  # (B, M)
        loss = loss - (F.logsigmoid(-hard_logits) * mask.to(hard_logits.dtype)).sum(1)
    return loss.mean()


def train_adafocal(data: Quadruples, out: str | Path, cfg: AdaFocalTrainConfig | None = None, resume: bool = False,
                   meta: dict | None = None, ctx: RunContext | None = None) -> AdaFocalModel:
    """Trains AdaFocal (variant `cfg.variant`) on `data` and returns the model, in eval mode. Writes `out`/
    model.safetensors + adafocal.json (the config, the variant, `meta`: the features' provenance) and
    train_log.jsonl; the state is saved after every epoch and `resume=True` continues a killed run. One process
    (`ctx`: its device; None: `cfg.device`)."""
    cfg = cfg if cfg is not None else AdaFocalTrainConfig()
    n, D = data.ref_global.shape
    model_cfg = cfg.model_config(int(D))
    if n < 2:
        raise ValueError(f"AdaFocal needs at least 2 training quadruples (the batch's other targets are the "
                         f"negatives), got {n}")
    ctx = (ctx or context(cfg.device)).for_run(cfg.seed, out)
    if ctx.world_size > 1:
        raise ValueError("foco adafocal train runs in one process; start it without torchrun")

    def build(ctx: RunContext) -> Plan:
        model = AdaFocalModel(model_cfg).to(ctx.device)

        def step(idx: torch.Tensor) -> Losses:  # idx (B,)
            ref, mod, box, target = data.batch(idx, ctx.device)
            query = model(ref, mod, box).query  # (B, D)
            hard = data.hard_batch(idx, ctx.device) if cfg.hard_negatives else None
            return {"loss": sigmoid_loss(model, query, target, hard)}

        def optimizer() -> torch.optim.Optimizer:
            return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                     weight_decay=cfg.weight_decay)

        phase = Phase(cfg.epochs, optimizer, step)
        backbone = (meta or {}).get("provenance", {}).get("backbone")
        loop = LoopConfig(n, min(cfg.batch_size, n), cfg.warmup_frac, cfg.grad_clip, cfg.max_steps,
                          name=f"AdaFocal ({cfg.variant})", identity={"backbone": backbone},
                          settings=settings_of(cfg), allow_changed=frozenset(cfg.allow_changed))
        return Plan(model, [phase], loop,
                    lambda history: model.save(ctx.out, {**recorded_settings(history), **(meta or {})}))
    return train_run(ctx, build, resume).model


def quadruples_from_parts(bench, feats, min_cover: float = 0.25) -> Quadruples:
    """Quadruples from an OACIR benchmark part (`CIRBenchmark`: each query's `box`, `box_size` and `instance`) and
    its cached features (`PartFeatures`): each query's reference (`feats.references`), its first text variant
    (`feats.texts`), its box on the reference's patch grid (`foco.model.box.query_box_masks`, as evaluation maps
    it; no box: all False), its first target's global (`feats.gallery`) and, as hard negatives, the globals of its
    subset's other images (reference and targets left out: OACIR's instance and context distractors)."""
    from ..model.box import query_box_masks
    missing = [q.id for q in bench.queries if not q.targets]
    if missing:
        raise ValueError(f"{bench.name} {bench.split}: {len(missing)} queries without a target (e.g. {missing[0]})")
    no_instance = [q.id for q in bench.queries if q.instance is None]
    if no_instance:
        raise ValueError(f"{bench.name} {bench.split}: {len(no_instance)} queries without an anchored instance "
                         f"(e.g. {no_instance[0]}): AdaFocal trains on OACIR quadruples")
    ref_pos = {r: i for i, r in enumerate(feats.reference_ids)}
    ref_rows = torch.tensor([ref_pos[q.reference] for q in bench.queries], dtype=torch.long)  # (Q,)
    text_pos = {t: i for i, t in enumerate(feats.text_ids)}
    text_rows = torch.tensor([text_pos[q.texts[0]] for q in bench.queries], dtype=torch.long)  # (Q,)
    gallery_pos = {g: i for i, g in enumerate(feats.gallery_ids)}
    target_rows = torch.tensor([gallery_pos[q.targets[0]] for q in bench.queries], dtype=torch.long)  # (Q,)
    patches = feats.references.patches[ref_rows]  # (Q, P, D)
    mask = query_box_masks(bench.queries, patches.shape[1], min_cover)  # (Q, P) or None: no box anywhere
    if mask is None:
        mask = torch.zeros(patches.shape[:2], dtype=torch.bool)
    others = [[gallery_pos[g] for g in q.subset if g != q.reference and g not in q.targets] for q in bench.queries]
    hard = hard_mask = None
    M = max(map(len, others), default=0)
    if M:
        rows = torch.tensor([o + [0] * (M - len(o)) for o in others], dtype=torch.long)  # (Q, M)
        hard_mask = torch.tensor([[True] * len(o) + [False] * (M - len(o)) for o in others])  # (Q, M)
        hard = feats.gallery[rows]  # (Q, M, D)
    return Quadruples(feats.references.global_[ref_rows], patches, feats.texts.take(text_rows),
                      mask.to(patches.device), feats.gallery[target_rows],
                      [q.instance for q in bench.queries], hard, hard_mask)
