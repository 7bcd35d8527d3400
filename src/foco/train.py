"""FoCo's two-stage training (paper §4.1): stage 1 trains F_Aggr alone with L_aggr; stage 2 trains F_Aggr and
F_Comp jointly with L_aggr + L_comp and a learning rate per module. AdamW, linear warm-up then cosine decay within
each stage, gradient clipping, seeded. The state (weights, optimiser, RNGs, position) is written atomically after
every epoch; `resume=True` continues a killed run and reaches the same weights as an uninterrupted one.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .data import PairTable
from .losses import foco_losses, plan_negatives
from .model import ComposedQueryEncoder, FoCoConfig
from .utils.checkpoint import has_training_state, load_training_state, save_training_state
from .utils.io import atomic_write_text, read_json
from .utils.plot import plot_curves
from .utils.progress import Bar

log = logging.getLogger(__name__)


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
    warmup_frac: float = 0.05  # of each stage's steps
    grad_clip: float = 1.0
    max_negatives: int | None = None  # cap on cross-instance negatives per anchor; None: all B - 1
    aggr_loss_in_stage2: bool = True  # False is ablation 2d
    seed: int = 0
    model: FoCoConfig = field(default_factory=FoCoConfig)


def _lr_factor(step: int, total: int, warmup_frac: float) -> float:
    warm = max(1, int(total * warmup_frac))
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


def _optimizer(model: ComposedQueryEncoder, cfg: FoCoTrainConfig, stage: int) -> torch.optim.AdamW:
    temps = [model.log_scale_aggr, model.bias_aggr] if stage == 1 else \
        [model.log_scale_aggr, model.bias_aggr, model.log_scale_comp, model.bias_comp]
    temps = [p for p in temps if p.requires_grad]
    if stage == 1:
        groups = [{"params": list(model.aggr.parameters()) + temps, "lr": cfg.lr_stage1}]
    else:
        groups = [{"params": list(model.aggr.parameters()), "lr": cfg.lr_aggr},
                  {"params": list(model.comp.parameters()) + temps, "lr": cfg.lr_comp}]
    for g in groups:
        g["base_lr"] = g["lr"]
    return torch.optim.AdamW(groups, weight_decay=cfg.weight_decay, betas=(0.9, 0.98))


def train_foco(table: PairTable, out: str | Path, cfg: FoCoTrainConfig, resume: bool = False,
               meta: dict | None = None, on_step: Callable[[int], None] | None = None) -> ComposedQueryEncoder:
    """Trains on `table`, writes `out`/foco.safetensors + foco.json, the log and the loss curve; returns the model.

    `meta` (e.g. the backbone spec) is stored in foco.json. `on_step(global_step)` is called after each step.
    """
    out = Path(out)
    state_dir = out / "train_state"
    if has_training_state(state_dir) and not resume:
        raise FileExistsError(f"{out} holds a training run; pass --resume to continue it or choose another --out")
    cfg.model.dim = int(table.image_global.shape[1])
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    model = ComposedQueryEncoder(cfg.model)
    n, B = len(table), min(cfg.batch_size, len(table))
    steps = n // B
    stages = [(1, cfg.stage1_epochs), (2, cfg.stage2_epochs)]
    pos = {"stage": 1, "epoch": 0}  # where to start: stage, and epochs already finished within it
    opt, opt_stage = None, 0
    if resume and has_training_state(state_dir):
        stage = int(read_json(state_dir / "state.json")["progress"]["stage"])
        opt, opt_stage = _optimizer(model, cfg, stage), stage
        restored = load_training_state(state_dir, model, opt, rng)
        gen.set_state(restored["extra_tensors"]["generator"])
        pos = {"stage": restored["stage"], "epoch": restored["epoch"]}
        log.info("resuming FoCo training at stage %d after epoch %d", pos["stage"], pos["epoch"])
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "train_log.jsonl"
    t0 = time.time()
    for stage, epochs in stages:
        if stage < pos["stage"]:
            continue
        start_epoch = pos["epoch"] if stage == pos["stage"] else 0
        if opt_stage != stage:
            opt, opt_stage = _optimizer(model, cfg, stage), stage
        with_comp = stage == 2
        for epoch in range(start_epoch, epochs):
            model.train()
            perm = torch.from_numpy(rng.permutation(n))
            sums: dict[str, float] = {}
            with Bar(steps, f"FoCo stage {stage} epoch {epoch + 1}/{epochs}") as bar:
                for s in range(steps):
                    factor = _lr_factor(epoch * steps + s, epochs * steps, cfg.warmup_frac)
                    for g in opt.param_groups:
                        g["lr"] = g["base_lr"] * factor
                    batch = table.batch(perm[s * B:(s + 1) * B])
                    plan = plan_negatives(batch.local_mask, cfg.max_negatives, gen)
                    parts = foco_losses(model, batch, plan, with_comp)
                    loss = parts["loss"] if (not with_comp or cfg.aggr_loss_in_stage2) else parts["comp"]
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], cfg.grad_clip)
                    opt.step()
                    for k, v in parts.items():
                        sums[k] = sums.get(k, 0.0) + v.item()
                    bar.update(1)
                    if on_step is not None:
                        on_step(s)
            rec = {"stage": stage, "epoch": epoch + 1, **{k: v / steps for k, v in sums.items()},
                   "tau_aggr": 1 / model.log_scale_aggr.exp().item(), "tau_comp": 1 / model.log_scale_comp.exp().item(),
                   "bias_aggr": model.bias_aggr.item(), "bias_comp": model.bias_comp.item(),
                   "elapsed_s": round(time.time() - t0, 2)}
            log.info("FoCo %s", rec)
            with log_path.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            save_training_state(state_dir, model, opt, rng, {"stage": stage, "epoch": epoch + 1},
                                extra_tensors={"generator": gen.get_state()})
            _plot_log(log_path, out / "loss_curve.png")
    model.eval()
    model.save(out)
    _add_meta(out, {"train": {k: v for k, v in asdict(cfg).items() if k != "model"}, **(meta or {})})
    return model


def _add_meta(out: Path, meta: dict) -> None:
    path = out / "foco.json"
    data = json.loads(path.read_text())
    data.update(meta)
    atomic_write_text(path, json.dumps(data, indent=2) + "\n")


def _plot_log(log_path: Path, png: Path) -> None:
    recs = [json.loads(l) for l in log_path.read_text().splitlines() if l.strip()]
    series = {name: [r.get(name) for r in recs] for name in ("aggr", "comp")}
    plot_curves(png, {k: v for k, v in series.items() if any(x is not None for x in v)},
                title="FoCo training loss per epoch (stage 1, then stage 2)", xlabel="epoch")
