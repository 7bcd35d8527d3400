"""FoCo's two-stage training (paper §4.1): stage 1 trains F_Aggr alone with L_aggr; stage 2 trains F_Aggr and
F_Comp jointly with L_aggr + L_comp and a learning rate per module. AdamW, linear warm-up then cosine decay within
each stage, gradient clipping, seeded, through `foco.train.loop`: the state (weights, optimiser, RNGs, position) is
written atomically after every epoch, and `resume=True` continues a killed run to the same weights as an
uninterrupted one.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

from .data import TrainingPairs
from .distributed import DistEnv, RunContext, context, ddp, gather_packed, rank_slice, total_across
from .harness import Plan, check_out, train_run
from .loop import Losses, LoopConfig, Phase, recorded_settings, settings_of
from .losses import Columns, NegativePlan, foco_losses, local_columns, plan_columns, plan_negatives, plan_on
from ..model import ComposedQueryEncoder, FoCoConfig
from ..utils.device import move
from ..utils.io import atomic_write_text

if TYPE_CHECKING:
    from .edit_data import EditTable


@dataclass
class FoCoTrainConfig:
    """Defaults are the paper's (CC3M, ViT-L/14); the quickstart overrides them for the small world."""

    stage1_epochs: int = 3
    stage2_epochs: int = 30
    batch_size: int = 512
    lr_stage1: float = 5e-4  # F_Aggr in stage 1
    lr_aggr: float = 5e-5  # F_Aggr in stage 2
    lr_comp: float = 3e-5  # F_Comp (and the loss temperatures) in stage 2
    weight_decay: float = 0.05
    # How the optimiser groups the parameters (`param_groups_of`). "siglip" (the default since issue 54): the
    # loss's temperatures and biases in their own group at `lr_temperature`, without weight decay, and no weight
    # decay on norms, biases and learned tokens either (open_clip's rule: no decay on tensors of fewer than 2
    # dims), as SigLIP trains its t' and b. "legacy" (foco before issue 54): tau and b in the module group of their
    # stage (F_Aggr's in stage 1, F_Comp's in stage 2) at that group's rate, with weight decay on every parameter.
    param_groups: str = "siglip"
    lr_temperature: float | None = None  # tau's and b's rate under "siglip"; None: their stage's module rate
    warmup_frac: float = 0.05  # of each stage's steps
    grad_clip: float = 1.0
    max_negatives: int | None = None  # cap on cross-instance negatives per anchor; None: all B - 1
    aggr_loss_in_stage2: bool = True  # False is ablation 2d
    loss: str = "sigmoid"  # the multi-positive sigmoid loss; "infonce" is ablation 2a (train/losses.py)
    negatives: str = "cross-instance"  # "naive-aggr" 2b, "naive-comp" 2c, "naive" both (train/losses.py)
    # NOT in the paper (issue 54's lever, harder negatives): each batch is made of groups of this many training
    # images that are one another's nearest neighbours by v_g (`neighbour_order`), so that the cross-instance
    # negatives share the anchor's content; 0 or 1: uniform batches, as the paper draws them
    negative_groups: int = 0
    # NOT in the paper (issue 54's lever, pointed to by the oracles): this share of the (local, context) pairs, drawn
    # once per run from its seed, has its contextual caption replaced by the local caption itself, so that F_Comp
    # also learns to read the focused object from the text (the paper's contexts never name it); 0: the paper
    focus_in_context: float = 0.0
    max_pairs: int = 5  # K, decomposition pairs used per image (the first ones); 1 is ablation 3b
    min_pairs: int = 1  # images with fewer decomposition pairs are left out of training (the K curve: --min-pairs K)
    # stage 3, trained with edits (foco-edits): NOT in the FoCo paper; 0 epochs (the default) is the paper's recipe
    stage3_epochs: int = 0
    lr_edit_aggr: float = 1e-4  # F_Aggr in stage 3
    lr_edit_comp: float = 1e-4  # F_Comp in stage 3
    edit_temperature: float = 0.05  # tau of the stage-3 losses
    preserve_weight: float = 0.3  # weight of L_preserve (the source image) against L_compose (the target caption)
    edit_negatives: bool = True  # negative captions as hard negatives
    image_weight: float = 0.0  # weight of L_image (the retrieved target image, where the table has one)
    max_steps: int | None = None  # cap on each stage's steps (smoke runs); None: every epoch
    seed: int = 0
    precision: str = "fp32"  # "bf16" (autocast) or "auto" (bf16 where native): foco.utils.precision
    compile: str | None = None  # torch.compile backend of the losses' forward ("inductor" for GPUs); None: eager
    device: str | None = None  # "auto", "cpu", "cuda", "cuda:N" (foco.utils.device); None: the process group's (`context`)
    sync_every: int | None = None  # losses read every N steps (foco.train.loop.sync_steps); None: auto
    model: FoCoConfig = field(default_factory=FoCoConfig)
    allow_changed: tuple[str, ...] = ()  # settings `--resume` may change (`--allow-changed`); recorded per phase


PARAM_GROUPS = ("siglip", "legacy")
# what a run saved before issue 54 trained with: a resumed one continues only with --param-groups legacy
IMPLIED_SETTINGS = {"param_groups": "legacy", "lr_temperature": None, "negative_groups": 0, "focus_in_context": 0.0,
                    "model.background_dropout": 0.0}


def param_groups_of(model: ComposedQueryEncoder, cfg: FoCoTrainConfig, stage: int) -> list[dict]:
    """The optimiser's parameter groups of `stage` (1: F_Aggr alone; 2: F_Aggr and F_Comp), each with its "name",
    "lr" and "weight_decay" (`FoCoTrainConfig.param_groups` says which rule). Empty groups are left out."""
    temps = [model.log_scale_aggr, model.bias_aggr] if stage == 1 else \
        [model.log_scale_aggr, model.bias_aggr, model.log_scale_comp, model.bias_comp]
    temps = [p for p in temps if p.requires_grad]
    modules = [("aggr", model.aggr, cfg.lr_stage1)] if stage == 1 else \
        [("aggr", model.aggr, cfg.lr_aggr), ("comp", model.comp, cfg.lr_comp)]
    if cfg.param_groups == "legacy":
        groups = [{"name": name, "params": list(m.parameters()), "lr": lr, "weight_decay": cfg.weight_decay}
                  for name, m, lr in modules]
        groups[-1]["params"] = groups[-1]["params"] + temps
    elif cfg.param_groups == "siglip":
        groups = []
        for name, m, lr in modules:
            ps = list(m.parameters())
            groups += [{"name": name, "params": [p for p in ps if p.ndim >= 2], "lr": lr,
                        "weight_decay": cfg.weight_decay},
                       {"name": f"{name} (norms, biases, tokens)", "params": [p for p in ps if p.ndim < 2], "lr": lr,
                        "weight_decay": 0.0}]
        lr_t = modules[-1][2] if cfg.lr_temperature is None else cfg.lr_temperature
        groups.append({"name": "temperatures and biases", "params": temps, "lr": lr_t, "weight_decay": 0.0})
    else:
        raise ValueError(f"param_groups {cfg.param_groups!r}: choose one of {', '.join(PARAM_GROUPS)} "
                         "(foco train --param-groups)")
    return [g for g in groups if g["params"]]


def _optimizer(model: ComposedQueryEncoder, cfg: FoCoTrainConfig, stage: int) -> torch.optim.AdamW:
    return torch.optim.AdamW(param_groups_of(model, cfg, stage), betas=(0.9, 0.98))


class FoCoObjective(torch.nn.Module):
    """FoCo's losses as a module's forward, so that DDP can wrap it (the model's own forward is inference)."""

    def __init__(self, model: ComposedQueryEncoder):
        super().__init__()
        self.model = model

    def forward(self, batch, plan=None, with_comp: bool = False, columns=None, row_offset: int = 0,
                edit: dict | None = None, loss: str = "sigmoid", negatives: str = "cross-instance") -> Losses:
        if edit is not None:  # stage 3: the edit losses, with `edit` their keyword arguments
            from .losses import edit_losses
            return edit_losses(self.model, batch, **edit)
        return foco_losses(self.model, batch, plan, with_comp, columns, row_offset, loss, negatives)


def distributed_step(objective: torch.nn.Module, table: TrainingPairs, idx: torch.Tensor, max_negatives: int | None,
                     gen: torch.Generator, with_comp: bool, env: DistEnv, sharded: bool = False,
                     loss: str = "sigmoid", negatives: str = "cross-instance", token_length: int | None = None
                     ) -> Losses:
    """This rank's rows of the global batch `idx` (B,) against columns gathered from every rank, under the global
    negative plan, which every rank draws identically on the CPU (see `foco.train.distributed`). `sharded`:
    `table` is this rank's own data and `idx` (b,) already its rows of the global batch.

    A step makes one collective (`gather_packed`: the columns, at the fixed `token_length`, every rank's longest
    context: `run_token_length`) and reads nothing on the host, where the table can tell the batch's pairs without
    reading features (`pair_mask`): the cached tables. Online tables gather the mask and the length first."""
    local = idx if sharded else rank_slice(idx, env)  # (b,)
    b = local.shape[0]
    off = env.rank * b
    batch = table.batch(local).on(env.device)
    plan = plan_on(_plan(table, idx, local, batch.local_mask, max_negatives, gen, env, sharded), env.torch_device)
    own = local_columns(batch, plan.neg_k[off:off + b], with_comp)
    parts = [own.anchor, own.image_global]  # (b, D), (b, D)
    if with_comp:
        L = token_length or total_across(own.ctx_tokens.shape[1], env, "max")
        pad = L - own.ctx_tokens.shape[1]
        parts += [F.pad(own.ctx_tokens, [0, 0, 0, pad]), F.pad(own.ctx_mask, [0, pad])]  # (b, L, D), (b, L)
    got = gather_packed(parts, env)
    columns = Columns(got[0], got[2] if with_comp else None, got[3] if with_comp else None, got[1])
    return objective(batch, plan, with_comp, columns, off, loss=loss, negatives=negatives)


def run_token_length(table: TrainingPairs, env: DistEnv) -> int | None:
    """The fixed token length of a run's gathers: the longest context of every rank's table (one collective, once);
    None where a table cannot tell it before reading (online encoding: each step then agrees on its own)."""
    length = getattr(table, "token_length", None)
    flag = total_across(0 if length is None else 1, env, "min")
    return total_across(int(length), env, "max") if flag else None


def _plan(table: TrainingPairs, idx: torch.Tensor, local: torch.Tensor, mask: torch.Tensor, max_negatives: int | None,
          gen: torch.Generator, env: DistEnv, sharded: bool) -> NegativePlan:
    """The step's negative plan on the CPU, the same on every rank: the global batch's, as one process draws it,
    from the pair masks of `idx` where the table is global; for rank-local data (`sharded`), every rank draws one
    uniform number a row of the global batch and the columns from the shared generator, and picks its own rows'
    k' with its numbers (uniform over each row's pairs), with nothing exchanged. The mask is
    gathered only from a table that cannot tell it before reading (online encoding)."""
    pair_mask = getattr(table, "pair_mask", None)
    if pair_mask is not None and not sharded:
        return plan_negatives(pair_mask(idx), max_negatives, gen)
    b = local.shape[0]
    B = b * env.world_size
    if pair_mask is not None:
        u = torch.rand(B, generator=gen)  # (B,) one uniform draw a row, the same on every rank
        own = pair_mask(local)  # (b, K)
        cum = own.cumsum(1).float() / own.sum(1, keepdim=True).clamp_min(1)  # (b, K)
        k = (cum <= u[env.rank * b:(env.rank + 1) * b, None]).sum(1).clamp(max=own.shape[1] - 1)  # (b,) k'
        neg_k = torch.zeros(B, dtype=torch.long)  # (B,) this rank's rows filled: the only ones it reads
        neg_k[env.rank * b:(env.rank + 1) * b] = k
        return NegativePlan(neg_k, plan_columns(B, max_negatives, gen))
    return plan_negatives(gather_packed([mask], env)[0].cpu(), max_negatives, gen)  # mask: this rank's (b, K)


def _stage(model: ComposedQueryEncoder, table: TrainingPairs, cfg: FoCoTrainConfig, gen: torch.Generator,
           stage: int, env: DistEnv = DistEnv(), objective: torch.nn.Module | None = None,
           sharded: bool = False, nbrs: torch.Tensor | None = None) -> Phase:
    with_comp = stage == 2

    length: list[int | None] = []  # the run's fixed token length, agreed on by the ranks at the first step

    def step(idx: torch.Tensor) -> Losses:  # idx (B,), the global batch; (B/N,) this rank's rows when sharded
        if env.enabled:
            if not length:
                length.append(run_token_length(table, env) if with_comp else None)
            return distributed_step(objective, table, idx, cfg.max_negatives, gen, with_comp, env, sharded, cfg.loss,
                                    cfg.negatives, length[0])
        cpu = table.batch(idx)  # on the CPU (cached features), or already on the device (online encoding)
        plan = plan_on(plan_negatives(cpu.local_mask.cpu(), cfg.max_negatives, gen), env.torch_device)
        batch = cpu.on(env.device)
        if objective is not None:  # compiled
            return objective(batch, plan, with_comp, loss=cfg.loss, negatives=cfg.negatives)
        return foco_losses(model, batch, plan, with_comp, loss=cfg.loss, negatives=cfg.negatives)

    def temperatures(_: int) -> dict:
        return {"tau_aggr": 1 / model.log_scale_aggr.exp().item(), "tau_comp": 1 / model.log_scale_comp.exp().item(),
                "bias_aggr": model.bias_aggr.item(), "bias_comp": model.bias_comp.item()}

    # the rows each step of this rank will read
    prefetch = table.prefetch if sharded or not env.enabled else \
        (lambda batches: table.prefetch([rank_slice(b, env) for b in batches]))
    order = None
    if nbrs is not None:  # --negative-groups: (N, m) candidates, searched once per run
        order = lambda perm: neighbour_order(perm, nbrs, cfg.negative_groups)  # noqa: E731
    return Phase(epochs=cfg.stage2_epochs if with_comp else cfg.stage1_epochs, order=order,
                 optimizer=lambda: _optimizer(model, cfg, stage), step=step,
                 objective="comp" if with_comp and not cfg.aggr_loss_in_stage2 else "loss",
                 tag={"stage": stage}, record=temperatures, local=sharded, prefetch=prefetch,
                 settings=("stage2_epochs", "lr_aggr", "lr_comp", "aggr_loss_in_stage2") if with_comp else ())


NEIGHBOUR_POOL = 8  # candidates per image, x (g - 1): on the world at g = 16, 91 % of images land in full groups


def _neighbours(table: TrainingPairs, g: int) -> torch.Tensor:
    """(N, NEIGHBOUR_POOL (g - 1)) each training image's nearest others by v_g: the candidates of its group."""
    return nearest_neighbours(image_globals(table), NEIGHBOUR_POOL * (g - 1))


def image_globals(table: TrainingPairs, chunk: int = 4096) -> torch.Tensor:
    """(N, D) float32 normalised v_g of every training image, read in chunks (a cached table reads its globals only)."""
    g = getattr(table, "image_global", None)
    if g is not None:
        return F.normalize(g.float(), dim=-1)
    images = getattr(table, "images", None)
    if images is None:
        raise ValueError("--negative-groups reads every image's global feature first: it needs a feature cache "
                         "(foco train --features), not --online encoding")
    n = len(table)
    rows = table.image_rows(torch.arange(n)).cpu().numpy()
    return torch.cat([F.normalize(images.rows("global", rows[s:s + chunk]).float(), dim=-1)
                      for s in range(0, n, chunk)])


def nearest_neighbours(g: torch.Tensor, m: int, chunk: int = 1024) -> torch.Tensor:
    """(N, m) long: each row's m nearest other rows of g (N, D) by cosine, nearest first; O(N^2 D) in chunks of
    rows (memory chunk x N)."""
    out = []
    for s in range(0, g.shape[0], chunk):
        sims = g[s:s + chunk] @ g.t()  # (c, N)
        own = torch.arange(sims.shape[0], device=sims.device)
        sims[own, own + s] = float("-inf")  # not itself
        out.append(sims.topk(min(m, g.shape[0] - 1), dim=1).indices)
    return torch.cat(out)


def neighbour_order(perm, nbrs: torch.Tensor, g: int):
    """The epoch's order `perm` (N,) regrouped: each image not yet placed, in `perm`'s order, is followed by its
    nearest neighbours not yet placed (up to g - 1 of them, from its candidates `nbrs` (N, m), nearest first), so
    consecutive runs of up to g share content; every image appears once. Late in an epoch a group may come out
    smaller where its candidates are taken (on the world at g = 16 with m = 120: 91 % of images in full groups,
    15.3 the image-weighted mean size; with m = 15, 21 % and 10.7)."""
    import numpy as np
    near = nbrs.numpy()
    used = np.zeros(len(perm), dtype=bool)
    out = []
    for a in perm:
        if used[a]:
            continue
        used[a] = True
        group = [a]
        for b in near[a]:
            if len(group) == g:
                break
            if not used[b]:
                used[b] = True
                group.append(b)
        out.extend(group)
    return np.asarray(out, dtype=perm.dtype)


def _edit_stage(model: ComposedQueryEncoder, edits: "EditTable", cfg: FoCoTrainConfig, env: DistEnv = DistEnv(),
                objective: torch.nn.Module | None = None) -> Phase:
    """Stage 3 (foco-edits, not in the paper): the instruction drives both modules, as at inference."""
    from .losses import edit_losses
    kwargs = dict(temperature=cfg.edit_temperature, preserve_weight=cfg.preserve_weight,
                  use_negatives=cfg.edit_negatives, image_weight=cfg.image_weight)

    def step(idx: torch.Tensor) -> Losses:  # idx (B,), the global batch
        if env.enabled:
            return objective(move(edits.batch(rank_slice(idx, env)), env.device), edit={**kwargs, "env": env})
        if objective is not None:  # compiled
            return objective(move(edits.batch(idx), env.device), edit=kwargs)
        return edit_losses(model, move(edits.batch(idx), env.device), **kwargs)

    def optimizer() -> torch.optim.AdamW:
        groups = [{"params": list(model.aggr.parameters()), "lr": cfg.lr_edit_aggr},
                  {"params": list(model.comp.parameters()), "lr": cfg.lr_edit_comp}]
        return torch.optim.AdamW(groups, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))

    return Phase(epochs=cfg.stage3_epochs, optimizer=optimizer, step=step, tag={"stage": 3}, n=len(edits),
                 settings=_STAGE3)


_STAGE3 = ("stage3_epochs", "lr_edit_aggr", "lr_edit_comp", "edit_temperature", "preserve_weight", "edit_negatives",
           "image_weight")


def train_foco(table: TrainingPairs, out: str | Path, cfg: FoCoTrainConfig, resume: bool = False,
               meta: dict | None = None, on_step: Callable[[int, dict[str, float]], None] | None = None,
               edits: "EditTable | None" = None, sharded: bool = False,
               ctx: RunContext | None = None,
               on_epoch: Callable[[ComposedQueryEncoder, dict], None] | None = None) -> ComposedQueryEncoder:
    """Trains on `table`, writes `out`/foco.safetensors + foco.json, the log and the loss curve; returns the model.

    `cfg` is not modified (the width is set on a copy). `meta` (e.g. the backbone spec) is stored in foco.json.
    `on_step(global_step, losses)` is called after each step, counting from 0 across the stages. With `edits` and
    `cfg.stage3_epochs > 0` a third stage trains on ITT triplets (foco-edits, a departure from the paper); a run
    that finished the two paper stages resumes into it. `on_epoch(model, record)` is called on the main rank after
    each epoch's log record (a val curve: `foco.eval.val_curve`; the model is back in training mode after it). `ctx`: the run's ranks and device (`init_distributed`
    under torchrun); None: this process on `cfg.device`.

    `sharded` (under torchrun): `table` holds this rank's own images (its feature shards, `corpus_parts`), and each
    step takes B/N of them per rank; the negatives still span the global batch. Without it every rank holds the
    whole table and takes its slice of one global permutation, as one process would.
    """
    if cfg.stage3_epochs > 0 and edits is None:
        raise ValueError("stage 3 (--stage3-epochs) trains on edits: pass --edits STORE")
    ctx = (ctx or context(cfg.device)).for_run(cfg.seed, out)
    check_out(ctx, resume)
    _check_ablations(cfg)
    if cfg.negative_groups > 1 and sharded:
        raise ValueError("--negative-groups orders the global batch by nearest neighbours: it needs every image "
                         "on every rank (leave out --sharded)")
    cfg = replace(cfg, model=replace(cfg.model, dim=table.dim))
    table = _with_pairs(table, cfg)
    if cfg.focus_in_context > 0:
        table = with_focus_in_context(table, cfg.focus_in_context, cfg.seed)
    if hasattr(table, "for_device"):  # read ahead for the run's device: pinned fp16 for a GPU
        table = table.for_device(ctx.device)

    def build(ctx: RunContext) -> Plan:
        gen = torch.Generator().manual_seed(cfg.seed)  # the negatives: drawn on the CPU, the same on every device
        model = ComposedQueryEncoder(cfg.model).to(ctx.device)  # initialised on the CPU (same weights), then moved
        objective = None
        if ctx.enabled:
            objective = ddp(FoCoObjective(model), ctx)
        if cfg.compile:  # the module is compiled, the weights stay `model`'s (saved and resumed as usual)
            objective = torch.compile(objective if objective is not None else FoCoObjective(model),
                                      backend=cfg.compile, dynamic=True)
        loop = LoopConfig(len(table), cfg.batch_size, cfg.warmup_frac, cfg.grad_clip, cfg.max_steps, name="FoCo",
                          plot_keys=("aggr", "comp", "compose", "preserve", "target_image"),
                          plot_title="FoCo training losses per step (stage 1, then stage 2" +
                                     (", then the edit stage)" if cfg.stage3_epochs else ")"),
                          identity={"backbone": (meta or {}).get("backbone")}, precision=cfg.precision,
                          settings=settings_of(cfg), allow_changed=frozenset(cfg.allow_changed),
                          implied=IMPLIED_SETTINGS,
                          sync_every=cfg.sync_every)
        nbrs = _neighbours(table, cfg.negative_groups) if cfg.negative_groups > 1 else None
        phases = [_stage(model, table, cfg, gen, s, ctx, objective, sharded and ctx.enabled, nbrs) for s in (1, 2)]
        if cfg.stage3_epochs > 0:
            phases.append(_edit_stage(model, edits, cfg, ctx, objective))

        def save(history: dict) -> None:
            model.save(ctx.out)
            recipe = {"recipe": "foco-edits: the paper's two stages, then a third on edit triplets (not in the FoCo "
                                "paper)"} if cfg.stage3_epochs else {}
            _add_meta(Path(ctx.out), {**recorded_settings(history), **recipe, **(meta or {})})
        def epoch_done(rec: dict) -> None:
            if on_epoch is not None and ctx.is_main:
                on_epoch(model, rec)
                model.train()
        return Plan(model, phases, loop, save, generator=gen, on_step=on_step,
                    on_epoch=epoch_done if on_epoch is not None else None)
    return train_run(ctx, build, resume).model


def _with_pairs(table: TrainingPairs, cfg: FoCoTrainConfig) -> TrainingPairs:
    """The table with each image's first `max_pairs` pairs, and without the images that have fewer than
    `min_pairs` (their count is printed: leaving images out is never silent)."""
    table = table.with_max_pairs(cfg.max_pairs)
    if cfg.min_pairs <= 1:
        return table
    counts = table.pairs_per_image()  # (N,)
    if counts is None:
        raise ValueError("--min-pairs needs a feature cache (foco train --features): an --online table does not know "
                         "each image's pairs before it reads them")
    keep = {i for i, n in zip(table.ids, counts.tolist()) if n >= cfg.min_pairs}
    if not keep:
        raise ValueError(f"--min-pairs {cfg.min_pairs}: no training image has that many decomposition pairs (most: "
                         f"{int(counts.max()) if len(counts) else 0}); lower --min-pairs or decompose with more pairs")
    print(f"--min-pairs {cfg.min_pairs}: training on {len(keep)} of {len(counts)} images (the other "
          f"{len(counts) - len(keep)} have fewer pairs)", flush=True)
    return table.subset(keep) if len(keep) < len(counts) else table


def with_focus_in_context(table: TrainingPairs, share: float, seed: int) -> TrainingPairs:
    """A copy of `table` in which `share` of the existing pairs (a seeded draw) have their context replaced by their
    local caption (`FoCoTrainConfig.focus_in_context`); the local captions, images and the rest are unchanged."""
    import copy
    ctx = getattr(table, "context_idx", None)
    if ctx is None:
        raise ValueError("--focus-in-context rewrites the table's pairs: it needs a feature cache (foco train "
                         "--features), not --online encoding")
    g = torch.Generator().manual_seed(seed)
    exists = table.local_idx >= 0  # (N, K)
    drawn = (torch.rand(ctx.shape, generator=g) < share) & exists  # (N, K)
    readable = _has_tokens(table, table.local_idx.clamp_min(0)) & exists  # a cache stores tokens only for contexts
    swap = drawn & readable
    if int(drawn.sum()) and not int(swap.sum()):
        raise ValueError("--focus-in-context: no local caption of this feature cache has token features (a training "
                         "cache stores tokens for contextual captions only), so none can serve as a context")
    print(f"--focus-in-context {share}: {int(swap.sum())} of {int(exists.sum())} pairs take their local caption as "
          f"their context; {int((drawn & ~readable).sum())} drawn pairs keep theirs (their local caption has no "
          "token features in the cache)", flush=True)
    out = copy.copy(table)
    out.context_idx = torch.where(swap, table.local_idx, ctx)
    out.__dict__.pop("_token_length", None)  # the longest context may have changed
    return out


def _has_tokens(table: TrainingPairs, idx: torch.Tensor) -> torch.Tensor:
    """(idx's shape) bool: whether text row idx has token features in the table's cache."""
    mask = getattr(table, "text_mask", None)
    if mask is not None:  # PairTable: padded tokens and their mask
        return mask[idx].any(-1)
    flat = idx.reshape(-1).numpy()
    return torch.from_numpy(table.texts.lengths(flat) > 0).view(idx.shape)


def _check_ablations(cfg: FoCoTrainConfig) -> None:
    from .losses import LOSSES, NEGATIVES
    if cfg.loss not in LOSSES:
        raise ValueError(f"loss {cfg.loss!r}: choose one of {', '.join(LOSSES)}")
    if cfg.negatives not in NEGATIVES:
        raise ValueError(f"negatives {cfg.negatives!r}: choose one of {', '.join(NEGATIVES)}")
    if cfg.param_groups not in PARAM_GROUPS:
        raise ValueError(f"param_groups {cfg.param_groups!r}: choose one of {', '.join(PARAM_GROUPS)} "
                         "(foco train --param-groups)")
    if cfg.lr_temperature is not None and cfg.param_groups != "siglip":
        raise ValueError("--lr-temperature sets the rate of the temperatures' own group, which only --param-groups "
                         f"siglip has (got {cfg.param_groups!r})")
    if not 0.0 <= cfg.focus_in_context <= 1.0:
        raise ValueError(f"focus_in_context must be in [0, 1], got {cfg.focus_in_context} (--focus-in-context)")
    if cfg.negative_groups == 1 or not 0 <= cfg.negative_groups <= cfg.batch_size:
        raise ValueError(f"negative_groups must be 0 (off) or 2 to the batch size ({cfg.batch_size}), got "
                         f"{cfg.negative_groups} (--negative-groups)")
    if cfg.model.background_dropout > 0 and (cfg.model.comp_layers == "linear" or not cfg.model.use_background):
        raise ValueError("--background-dropout drops F_Comp's background input, which this F_Comp does not read "
                         "(linear fusion or use_background off)")
    from .loop import setting_name
    if "param_groups" in {setting_name(n) for n in cfg.allow_changed}:
        raise ValueError("--allow-changed param_groups: the optimiser's groups cannot change within a run (its saved "
                         "state has the old groups); --restart it, or continue with the --param-groups it began with")
    if cfg.max_pairs < 1:
        raise ValueError(f"max_pairs (K) must be at least 1, got {cfg.max_pairs}")
    if not 1 <= cfg.min_pairs <= cfg.max_pairs:
        raise ValueError(f"min_pairs must be between 1 and max_pairs ({cfg.max_pairs}), got {cfg.min_pairs} "
                         "(foco train --min-pairs, --max-pairs)")
    if cfg.model.focus != "attention" and cfg.stage1_epochs > 0:
        raise ValueError(f"focus {cfg.model.focus!r} has no F_Aggr, so stage 1 (L_aggr alone) trains nothing: set "
                         "stage1_epochs to 0 (--stage1-epochs 0)")


def _add_meta(out: Path, meta: dict) -> None:
    path = out / "foco.json"
    data = json.loads(path.read_text())
    data.update(meta)
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")
