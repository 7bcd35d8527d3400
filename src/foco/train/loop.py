"""The one training loop of FoCo, Pic2Word and the world backbone: a list of `Phase`s (FoCo's two stages, one phase
elsewhere), each with its own optimiser and schedule, `lr = base_lr * lr_factor(step, T, warmup_frac)` over its
T = epochs x steps-per-epoch steps. Each epoch permutes the N examples with the numpy generator and feeds `step`
batches of B indices (dropping a last partial one); after it the loop appends a record to `out`/train_log.jsonl,
redraws the loss curve if asked and saves `out`/train_state, from which `resume=True` reaches the same weights as
an uninterrupted run.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch

from ..records import read as read_record
from ..utils.checkpoint import STATE_JSON, has_training_state, load_training_state, save_training_state
from ..utils.io import _write_failed
from ..utils.plot import plot_losses
from ..utils.precision import autocast, resolve_precision
from ..utils.progress import Bar, NoBar
from .distributed import DistEnv, RankLost, barrier, mean_block, rank_lost, relax, steady, total_across

log = logging.getLogger(__name__)

Losses = dict[str, torch.Tensor]  # name -> scalar loss
OnStep = Callable[[int, dict[str, float]], None]  # (global step from 0 over all phases, losses)


def read_state(state_dir: Path) -> dict:
    """A run's train_state/state.json, checked against its schema (`foco.records`): a damaged one names the file
    and the field."""
    return read_record("state.json", state_dir / STATE_JSON)


def lr_factor(step: int, total: int, warmup_frac: float, schedule: str = "cosine") -> float:
    """The multiplier of the base learning rate at `step` (from 0) of `total`: linear warm-up, then cosine decay
    (`schedule` "cosine") or the base rate (`schedule` "constant", LinCIR's constant_with_warmup)."""
    warm = max(1, int(total * warmup_frac))
    if step < warm:
        return (step + 1) / warm
    if schedule == "constant":
        return 1.0
    return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm)))


@dataclass
class Phase:
    """A stretch of training with one optimiser and one schedule."""

    epochs: int
    optimizer: Callable[[], torch.optim.Optimizer]  # built when the phase starts or resumes; base_lr defaults to lr
    step: Callable[[torch.Tensor], Losses]  # batch indices (B,) long -> scalar losses, with grad
    objective: str = "loss"  # the loss that is backpropagated; all are logged
    tag: dict = field(default_factory=dict)  # e.g. {"stage": 1}: names the phase in the state, log and progress bar
    record: Callable[[int], dict] = lambda global_step: {}  # extra log fields after an epoch
    clip_params: Callable[[], Iterable[torch.nn.Parameter]] | None = None  # clipped together; None: the optimiser's
    n: int | None = None  # examples per epoch when this phase has its own data; None: LoopConfig.n
    local: bool = False  # data-parallel on rank-local data: n is this rank's, `step` gets its B/N local indices
    prefetch: Callable[[list[torch.Tensor]], None] | None = None  # told each epoch's batches before its steps
    settings: tuple[str, ...] = ()  # the settings (LoopConfig.settings keys) only this phase reads: they may change
                                    # on resume while the phase has not begun (recorded where it begins)
    order: Callable[[np.ndarray], np.ndarray] | None = None  # the epoch's random order -> the order batched (e.g.
                                    # neighbours side by side); a function of its input alone, so a resume repeats it


@dataclass
class LoopConfig:
    n: int  # N, examples per epoch
    batch_size: int  # B (at most N)
    warmup_frac: float = 0.05  # of each phase's steps
    grad_clip: float = 1.0  # max total gradient norm; 0: no clipping (the norm is still measured and checked)
    max_steps: int | None = None  # cap on each phase's steps; its schedule ends there
    name: str = "training"  # in log lines and progress bars, e.g. "FoCo"
    plot_keys: tuple[str, ...] = ()  # losses drawn per step into loss_curve.png; () draws nothing
    plot_title: str = ""
    identity: dict = field(default_factory=dict)  # what a resumed run must share (e.g. the features' backbone)
    settings: dict = field(default_factory=dict)  # the trainer's settings (flat): a resumed run must share them
    allow_changed: frozenset[str] = frozenset()  # settings a resumed run may change (--allow-changed): recorded
    implied: dict = field(default_factory=dict)  # the value a setting had in runs saved before it was recorded
    precision: str = "fp32"  # "bf16": each step's forward pass under bf16 autocast (foco.utils.precision)
    env: DistEnv = field(default_factory=DistEnv)  # data-parallel ranks: rank 0 writes, logs average over ranks
    device: str = "cpu"  # where the model and batches live: autocast runs for this device type
    schedule: str = "cosine"  # after the warm-up: "cosine" decay or "constant" (`lr_factor`)
    sync_every: int | None = None  # logged losses and the finite check are read every N steps; None: auto
                                   # (`sync_steps`: 1 on the CPU, SYNC_EVERY_GPU on a GPU)


SYNC_EVERY_GPU = 50  # a GPU run reads its losses once every this many steps (--sync-every)


def sync_steps(cfg: LoopConfig) -> int:
    """How many steps pass between two reads of the logged values (the only host-device syncs of a step): the
    setting, or auto: 1 on the CPU, where a read costs nothing and a non-finite step is caught before it is taken,
    SYNC_EVERY_GPU on a GPU, where each read drains the GPU's queue."""
    if cfg.sync_every is not None:
        if cfg.sync_every < 1:
            raise ValueError(f"--sync-every must be at least 1, got {cfg.sync_every}")
        return int(cfg.sync_every)
    return SYNC_EVERY_GPU if torch.device(cfg.device).type == "cuda" else 1


# where or how fast a run computes, not what; precision is compared resolved, in the run's identity
RUN_ONLY = frozenset({"device", "compile", "threads", "dist_timeout", "setup_timeout", "allow_changed", "precision",
                      "sync_every"})


def settings_of(cfg, skip: frozenset[str] = RUN_ONLY) -> dict:
    """A trainer config's settings as the loop records and compares them: flat ("model.dim"), JSON values, without
    the ones that only say where or how fast it runs (`RUN_ONLY`)."""
    import dataclasses
    out: dict = {}

    def walk(prefix: str, value) -> None:
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)
        if isinstance(value, dict):
            for k, v in value.items():
                if k not in skip:
                    walk(f"{prefix}{k}.", v)
            return
        out[prefix[:-1]] = list(value) if isinstance(value, (tuple, frozenset, set)) else value
    walk("", cfg)
    return out


def refuse_overwrite(out: Path, resume: bool, hint: str) -> None:
    if has_training_state(out / "train_state") and not resume:
        raise FileExistsError(f"{out} holds a training run; {hint}")


def clear_run(out: str | Path) -> list[str]:
    """Starts a run over (every training command's `--restart`): removes what a trainer writes into `out`
    (`foco.utils.ownership.RUN_OUTPUTS`: its state, logs and weights), so that nothing of the old run remains, and
    nothing else: the owner file, a user's files (a folder entered with --force) and anything foco does not write
    stay. Returns the names removed."""
    import shutil
    from ..utils.ownership import removable
    removed = []
    for entry in removable(out):
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        removed.append(entry.name)
    return removed


def run(model: torch.nn.Module, phases: list[Phase], out: str | Path, cfg: LoopConfig, rng: np.random.Generator,
        resume: bool = False, generator: torch.Generator | None = None, on_step: OnStep | None = None,
        on_epoch: Callable[[dict], None] | None = None) -> dict:
    """Trains `model` through `phases` and leaves it in eval mode. `generator`, a torch RNG the steps draw from, is
    saved and restored with the state. `on_epoch(record)` follows each epoch's log record. Data-parallel, a rank
    that loses the others raises `RankLost`, which says how to resume.

    Returns the run's settings history, {"start": the settings it began with, "changes": [{"at": where a change
    took effect (phase and epoch), "changed": {setting: [before, after]}}]}: `--resume` refuses changed settings
    (`cfg.settings`) unless `cfg.allow_changed` names them, and then records them from where the run stands,
    never over the epochs already trained."""
    try:
        return _run(model, phases, out, cfg, rng, resume, generator, on_step, on_epoch)
    except RuntimeError as exc:
        if cfg.env.world_size > 1 and not isinstance(exc, RankLost):  # a group of one has no other rank to lose
            raise rank_lost(exc, cfg.env) from exc
        raise


def _run(model: torch.nn.Module, phases: list[Phase], out: str | Path, cfg: LoopConfig, rng: np.random.Generator,
         resume: bool, generator: torch.Generator | None, on_step: OnStep | None,
         on_epoch: Callable[[dict], None] | None) -> dict:
    out = Path(out)
    _check(phases, cfg)
    history, pending = {"start": dict(cfg.settings), "changes": []}, None
    sizes = [p.n or cfg.n for p in phases]  # N of each phase (this rank's N_r for a local phase)
    batch = [min(cfg.batch_size, n) for n in sizes]  # B of each phase (B/N for a local phase)
    steps = [n // b for n, b in zip(sizes, batch)]
    totals_n = list(sizes)  # what the run's identity records: every rank's examples together
    for i, p in enumerate(phases):
        if p.local and cfg.env.enabled:
            batch[i], steps[i], totals_n[i] = _local_steps(p, sizes[i], cfg)
    totals = [p.epochs * s if cfg.max_steps is None else min(cfg.max_steps, p.epochs * s)
              for p, s in zip(phases, steps)]
    first, epoch0, opt = 0, 0, None
    if resume and has_training_state(out / "train_state"):
        _check_identity(out / "train_state", _identity(phases, totals_n, cfg))
        history, pending = _check_settings(out / "train_state", cfg, phases, _saved_phase(out / "train_state", phases))
        first, epoch0, opt = _restore(out / "train_state", model, phases, rng, generator, cfg.name, cfg.env)
        if cfg.env.is_main:
            cut_logs(out)
    elif cfg.env.is_main:
        cut_logs(out, to_nothing=True)  # lines of a run that saved no state (e.g. a full disk at its first epoch)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    plotted = [float("-inf")]  # when the loss curve was last drawn (never: the first epoch draws it)
    for i, phase in enumerate(phases[first:], first):
        n, B, S = sizes[i], batch[i], steps[i]
        opt, done = (opt, epoch0 * S) if i == first and opt is not None else (_optimizer(phase), 0)
        relax(cfg.env)  # until its first step is done (compiling, agreeing on shapes): the setup timeout
        for epoch in range(done // S, phase.epochs):
            if done >= totals[i]:
                break
            model.train()
            perm = torch.from_numpy(_permutation(rng, n, phase, cfg.env))  # (N,)
            batches = [perm[s * B:(s + 1) * B] for s in range(min(S, totals[i] - done))]  # each (B,)
            if phase.prefetch is not None:  # e.g. online encoding: workers decode the epoch's images ahead
                phase.prefetch(batches)
            desc = " ".join([cfg.name, *_words(phase.tag), f"epoch {epoch + 1}/{phase.epochs}"])
            means, step_log = _epoch(phase, opt, batches, cfg, range(done, totals[i]), sum(totals[:i]), desc,
                                     on_step)
            done += len(batches)
            rec = {**phase.tag, "epoch": epoch + 1, **means, **phase.record(sum(totals[:i]) + done),
                   "elapsed_s": round(time.time() - t0, 2)}
            last = (epoch == phase.epochs - 1 or done >= totals[i]) and \
                all(totals[j] == 0 for j in range(i + 1, len(phases)))  # no later phase has a step to take
            for j in [j for j in sorted(pending or {}) if j <= i]:  # changes made on resume take effect here
                history["changes"].append({"at": {**phase.tag, "epoch": epoch + 1}, "changed": pending.pop(j)})
            _end_epoch(out, model, opt, rng, generator, cfg, rec,
                       {**phase.tag, "epoch": epoch + 1, "identity": _identity(phases, totals_n, cfg),
                        "settings": history},
                       [{"step": k, **phase.tag, **v} for k, v in step_log], plotted, last)
            if on_epoch is not None:
                on_epoch(rec)
    model.eval()
    if pending:  # changes to phases that trained no step now (e.g. fewer epochs): recorded where the run stands
        saved = read_state(out / "train_state")["progress"] if has_training_state(out / "train_state") \
            else {}
        at = {k: v for k, v in saved.items() if k not in ("identity", "settings", "logs")}
        history["changes"] += [{"at": {**at, "trained": "no step after it"}, "changed": pending.pop(j)}
                               for j in sorted(pending)]
        if cfg.env.is_main and has_training_state(out / "train_state"):
            _record_history(out / "train_state", history)
    return history


LOGS = ("train_log.jsonl", "train_steps.jsonl")  # appended each epoch, then the state records their sizes


def _log_sizes(out: Path) -> dict[str, int]:
    return {name: (out / name).stat().st_size if (out / name).is_file() else 0 for name in LOGS}


def cut_logs(out: str | Path, to_nothing: bool = False) -> dict[str, int]:
    """Cuts each log back to the size the saved state records: the lines of an epoch whose state was never saved
    (a run stopped between appending them and saving, or mid-line) are removed, so that the resumed run writes
    that epoch once. `to_nothing`: a run that starts with no saved state keeps no earlier lines. Returns {log:
    bytes removed} (nothing for a state written before sizes were recorded)."""
    out = Path(out)
    if to_nothing:
        sizes = {name: 0 for name in LOGS}
    else:
        sizes = read_state(out / "train_state")["progress"].get("logs") or {}
    removed = {}
    for name, size in sizes.items():
        path = out / name
        if name in LOGS and path.is_file() and path.stat().st_size > int(size):
            removed[name] = path.stat().st_size - int(size)
            with path.open("r+b") as f:
                f.truncate(int(size))
    if removed:
        log.info("cut back %s to the saved state (an epoch logged but not saved)",
                 ", ".join(f"{n} by {b} bytes" for n, b in removed.items()))
    return removed


def _record_history(state_dir: Path, history: dict) -> None:
    """Writes the settings history into a saved state whose weights did not change (no step was trained)."""
    from ..utils.io import atomic_write_text
    meta = read_state(state_dir)
    meta["progress"]["settings"] = history
    atomic_write_text(state_dir / STATE_JSON, json.dumps(meta, indent=1, sort_keys=True))


def _local_steps(phase: Phase, n: int, cfg: LoopConfig) -> tuple[int, int, int]:
    """A local phase's (B/N, steps per epoch, N over all ranks): every rank takes the same number of steps, the
    fewest any rank's data allows."""
    env = cfg.env
    if cfg.batch_size % env.world_size:
        raise ValueError(f"the global batch of {cfg.batch_size} does not split over {env.world_size} ranks; use a "
                         f"--batch-size divisible by {env.world_size}")
    b = cfg.batch_size // env.world_size
    steps = total_across(n // b, env, "min")
    if steps < 1:
        where = " ".join(_words(phase.tag)) or "training"
        raise ValueError(f"{where}: a rank holds fewer than {b} examples (B/N of --batch-size {cfg.batch_size}); "
                         "give every rank more data (more shards) or lower --batch-size")
    return b, steps, total_across(n, env)


def _permutation(rng: np.random.Generator, n: int, phase: Phase, env: DistEnv) -> np.ndarray:
    """The epoch's order of the n examples. A local phase on several ranks draws a seed from the shared generator
    (the same on every rank, saved with the state) and permutes this rank's data with it and the rank, so that
    ranks differ and `--resume` repeats the same orders."""
    if not (phase.local and env.enabled):
        perm = rng.permutation(n)
        return perm if phase.order is None else phase.order(perm)
    if phase.order is not None:
        raise ValueError("a phase that orders its batches runs on one process or on a global table (not --sharded)")
    return np.random.default_rng([int(rng.integers(2 ** 63)), env.rank]).permutation(n)


def _check(phases: list[Phase], cfg: LoopConfig) -> None:
    """Refuses settings that would divide by zero or save an untrained model as if trained, naming the flag."""
    if cfg.batch_size < 1:
        raise ValueError(f"--batch-size must be at least 1, got {cfg.batch_size}")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        raise ValueError(f"--max-steps must be at least 1, got {cfg.max_steps}")
    for p in phases:
        where = " ".join(_words(p.tag)) or "training"
        if p.epochs < 0:
            raise ValueError(f"{where}: epochs must be 0 or more, got {p.epochs}")
        if p.epochs and (p.n or cfg.n) < 1 and not (p.local and cfg.env.enabled):  # local: _local_steps says
            raise ValueError(f"{where}: no training examples")
    if not any(p.epochs for p in phases):
        raise ValueError("every phase has 0 epochs: nothing would be trained")


def _identity(phases: list[Phase], sizes: list[int], cfg: LoopConfig) -> dict:
    """What a run is: its batch size, each phase's data size, and what the trainer adds (`LoopConfig.identity`)."""
    return {"batch_size": cfg.batch_size, **{f"examples ({' '.join(_words(p.tag)) or 'training'})": n
                                             for p, n in zip(phases, sizes) if p.epochs},
            "precision": resolve_precision(cfg.precision, cfg.device), **cfg.identity}


def _check_identity(state_dir: Path, now: dict) -> None:
    """`--resume` continues the same run: refuses another batch size, other data or another backbone, and says
    which (keys only one side records, such as a phase added after the saved ones, are not compared)."""
    saved = read_state(state_dir)["progress"].get("identity") or {}
    diff = [f"{k} {saved[k]!r} (now {now[k]!r})" for k in sorted(set(saved) & set(now)) if saved[k] != now[k]]
    if diff:
        raise ValueError(f"{state_dir.parent} holds a run trained with " + ", ".join(diff) +
                         "; continue it with the same settings and data, pass --restart to start it over, or choose "
                         "another --out")


def recorded_settings(history: dict) -> dict:
    """What a trainer writes beside its weights from `run`'s history: the settings the run began with ("train")
    and every change made on resume, with where it took effect ("train_changes")."""
    return {"train": history["start"], "train_changes": history["changes"]}


def effective_settings(meta: dict) -> dict:
    """The settings in force at the end of a run, from what `recorded_settings` wrote: the start with every
    recorded change applied."""
    out = dict(meta.get("train") or {})
    for change in meta.get("train_changes") or []:
        out.update({k: v[1] for k, v in change["changed"].items()})
    return out


def setting_name(name: str) -> str:
    """A setting as `--allow-changed` may spell it: "lr-stage1", "--lr-stage1" and "lr_stage1" are one."""
    return name.strip().lstrip("-").replace("-", "_")


def _saved_phase(state_dir: Path, phases: list[Phase]) -> int:
    saved = read_state(state_dir)["progress"]
    i = next((i for i, p in enumerate(phases) if all(saved.get(k) == v for k, v in p.tag.items())), None)
    if i is None:
        raise ValueError(f"{state_dir} stopped at {saved}, which is no phase of this run")
    return i


def _check_settings(state_dir: Path, cfg: LoopConfig, phases: list[Phase], first: int
                    ) -> tuple[dict, dict[int, dict]]:
    """(history, {phase index: changes recorded when it trains}): refuses settings that differ from those the
    saved run trained with, unless `cfg.allow_changed` names each; a name that is no setting is refused too.
    Settings of a phase that has not begun (`Phase.settings`) may change freely and are recorded where that phase
    begins. States saved before settings were recorded start their history here."""
    allowed = {setting_name(n) for n in cfg.allow_changed}
    unknown = sorted(allowed - set(cfg.settings))
    if unknown:
        raise ValueError(f"--allow-changed: {', '.join(unknown)} is no setting of this run; choose from "
                         f"{', '.join(sorted(cfg.settings))}")
    history = read_state(state_dir)["progress"].get("settings")
    if not history:
        return {"start": dict(cfg.settings), "changes": []}, None
    current = {**{k: v for k, v in cfg.implied.items() if k in cfg.settings}, **history["start"]}
    for change in history["changes"]:
        current.update({k: v[1] for k, v in change["changed"].items()})
    diff = {k: [current[k], cfg.settings[k]] for k in sorted(set(current) & set(cfg.settings))
            if current[k] != cfg.settings[k]}
    later = {k: j for j in range(first + 1, len(phases)) for k in phases[j].settings}  # phases not begun
    refused = [k for k in diff if k not in allowed and k not in later]
    if refused:
        raise ValueError(f"{state_dir.parent} holds a run trained with " +
                         ", ".join(f"{k}={diff[k][0]!r} (now {diff[k][1]!r})" for k in refused) +
                         "; continue it with the same settings, pass --allow-changed " + ",".join(refused) +
                         " to train on with the new values (recorded from here on, never over the past), or "
                         "--restart to start it over")
    pending: dict[int, dict] = {}
    for k, v in diff.items():
        pending.setdefault(later.get(k, first), {})[k] = v
    return history, pending


def _words(tag: dict) -> list[str]:
    return [f"{k} {v}" for k, v in tag.items()]


def _optimizer(phase: Phase) -> torch.optim.Optimizer:
    opt = phase.optimizer()
    for g in opt.param_groups:
        g.setdefault("base_lr", g["lr"])
    return opt


def _restore(state_dir: Path, model: torch.nn.Module, phases: list[Phase], rng: np.random.Generator,
             generator: torch.Generator | None, name: str, env: DistEnv = DistEnv()
             ) -> tuple[int, int, torch.optim.Optimizer]:
    """Loads the state into `model`, the RNGs and a new optimiser of the saved phase: (phase, epochs done, opt)."""
    i = _saved_phase(state_dir, phases)
    opt = _optimizer(phases[i])
    fresh = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    restored = load_training_state(state_dir, model, opt, rng)
    for g, f in zip(opt.param_groups, fresh):
        g.update(f)  # this run's hyperparameters (equal to the saved ones unless --allow-changed changed them)
    if generator is not None:
        saved = restored.get("extra_tensors", {}).get("generator")
        if saved is None:
            raise ValueError(f"the training state in {state_dir} has no saved torch generator, which this {name} "
                             f"run draws from (it was written by an older foco): remove {state_dir.parent} to start "
                             "the run again, or choose another --out")
        generator.set_state(saved)
    log.info("resuming %s training%s after epoch %d", name, "".join(f" at {w}" for w in _words(phases[i].tag)),
             restored["epoch"])
    load_rank_rng(state_dir, env, _at(restored))
    return i, int(restored["epoch"]), opt


def _rank_rng_path(state_dir: Path, env: DistEnv) -> Path:
    return state_dir / f"rng-rank{env.rank}.safetensors"


def _at(progress: dict) -> dict:
    """Where a saved state stands: its phase tag and epoch (what a rank's RNG file must match)."""
    return {k: v for k, v in progress.items() if k not in ("identity", "settings", "logs", "extra_tensors")}


def save_rank_rng(state_dir: Path, env: DistEnv, at: dict) -> None:
    """Data-parallel: each rank saves its own torch RNG states (the CPU's and its GPU's, which its dropout masks
    draw from: ranks are seeded seed + rank) beside the state rank 0 writes, stamped with where the run stands
    (`at`: phase and epoch), so that `--resume` draws what an uninterrupted run would."""
    if not env.enabled:
        return
    from safetensors.torch import save
    from ..utils.io import atomic_write_bytes
    tensors = {"rng/torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["rng/cuda"] = torch.cuda.get_rng_state()  # this rank's current GPU
    atomic_write_bytes(_rank_rng_path(state_dir, env), save(tensors, metadata={"at": json.dumps(at, sort_keys=True)}))


def load_rank_rng(state_dir: Path, env: DistEnv, at: dict) -> bool:
    """Restores this rank's RNG states saved by `save_rank_rng` at the state's phase and epoch (`at`). Where there
    are none (a state of another rank count or of an older foco), or they are of another epoch (the job stopped
    between the ranks' files and rank 0's state), each rank draws a seed from the restored state plus its rank, so
    that ranks still differ; returns False then."""
    path = _rank_rng_path(state_dir, env)
    if not env.enabled:
        return False
    if path.is_file():
        from safetensors import safe_open
        from ..utils.io import load_tensors
        tensors = load_tensors(path, f"the rank's RNG state is damaged: remove {path} to resume with fresh draws")
        with safe_open(str(path), "pt") as f:
            saved_at = (f.metadata() or {}).get("at")
        if saved_at == json.dumps(at, sort_keys=True):
            torch.set_rng_state(tensors["rng/torch"])
            if "rng/cuda" in tensors and torch.cuda.is_available():
                torch.cuda.set_rng_state(tensors["rng/cuda"])
            return True
        log.info("%s is of %s, not of the saved state (%s): rank %d draws anew", path, saved_at, at, env.rank)
    torch.manual_seed(int(torch.randint(2 ** 62, (1,))) + env.rank)  # the same draw on every rank, plus the rank
    return False


def _epoch(phase: Phase, opt: torch.optim.Optimizer, batches: list[torch.Tensor], cfg: LoopConfig,
           schedule: range, offset: int, desc: str, on_step: OnStep | None
           ) -> tuple[dict[str, float], list[tuple[int, dict[str, float]]]]:
    """One epoch's steps (`schedule`: the phase's steps from here to its end); returns each loss's mean and the
    (global step, losses) of every step.

    Nothing of a step is read on the host: its losses and gradient norm stay on the device, one (values,) row a
    step, and every N steps (`sync_steps`) the block of rows is averaged over ranks (one all-reduce) and read (one
    sync), then checked, logged and handed to `on_step`. The check is also done on the device every step: an
    optimiser that can skip a step there (fused Adam/AdamW, `_device_skip`) skips a non-finite one, so its update is
    never applied; the read at the end of the block then stops the run at that step. With N = 1 the read comes
    before the optimiser step, as does the stop."""
    params = list(phase.clip_params() if phase.clip_params else (p for g in opt.param_groups for p in g["params"]))
    every = sync_steps(cfg)
    skip = _device_skip(opt) if every > 1 else False
    sums: dict[str, float] = {}
    log_: list[tuple[int, dict[str, float]]] = []
    rows: list[tuple[int, torch.Tensor]] = []  # (global step, (V + 1,) its losses and gradient norm, on the device)
    keys: list[str] = []  # the losses the block's rows hold, in order; a step with others reads the block first
    with (Bar(len(batches), desc) if cfg.env.is_main else NoBar()) as bar:
        for n, (idx, step) in enumerate(zip(batches, schedule)):
            factor = lr_factor(step, schedule.stop, cfg.warmup_frac, cfg.schedule)
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * factor
            with autocast(cfg.precision, cfg.device):
                losses = phase.step(idx)
            opt.zero_grad(set_to_none=True)
            losses[phase.objective].backward()
            # after DDP's all-reduce: every rank's; grad_clip 0 measures the norm and clips nothing
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            read: list[tuple[int, dict[str, float]]] = []
            if rows and list(losses) != keys:  # this step logs other losses (e.g. a term absent from its batch)
                read, rows = _read_block(rows, keys, cfg, desc), []
            keys = list(losses)
            loss0 = losses[phase.objective]
            row = torch.stack([losses[k].detach().float().reshape(()) for k in keys] +
                              [norm.detach().float().reshape(()).to(loss0.device)])  # (V + 1,)
            rows.append((offset + step, row))
            if skip:
                opt.found_inf = (~torch.isfinite(row).all()).float()  # the fused step is skipped on the device
            if every == 1:  # read before the step: a non-finite one is never taken
                read, rows = read + _read_block(rows, keys, cfg, desc), []
            opt.step()
            bar.update(1)
            if n == 0:
                steady(cfg.env)  # the first step is done: collectives now time out after the step timeout
            if rows and (len(rows) >= every or n == len(batches) - 1):
                read, rows = read + _read_block(rows, keys, cfg, desc), []
            for step_, values in read:
                for k, v in values.items():
                    sums[k] = sums.get(k, 0.0) + v
                log_.append((step_, values))
                if on_step is not None:
                    on_step(step_, values)
    if skip:
        opt.found_inf = None
    return {k: v / max(1, len(batches)) for k, v in sums.items()}, log_


def _read_block(rows: list[tuple[int, torch.Tensor]], keys: list[str], cfg: LoopConfig, desc: str
                ) -> list[tuple[int, dict[str, float]]]:
    """The block's values averaged over ranks (one collective) and read (one sync), checked step by step:
    [(global step, {loss: value})]."""
    block = mean_block(torch.stack([r for _, r in rows]), cfg.env).tolist()  # (n, V + 1)
    out = []
    for (step, _), vals in zip(rows, block):
        values = dict(zip(keys, vals[:-1]))
        _check_finite(values, vals[-1], cfg, desc, step)
        out.append((step, values))
    return out


def _device_skip(opt: torch.optim.Optimizer) -> bool:
    """Makes `opt` skip a step on the device when told (`opt.found_inf`, as the AMP grad scaler does): Adam and
    AdamW are switched to their fused kernels, which take that flag, when every parameter is a float tensor on the
    CPU or CUDA. False where that cannot be (another optimiser): a non-finite step is then found at the block's
    read, after its update."""
    if type(opt) not in (torch.optim.Adam, torch.optim.AdamW):
        return False
    ps = [p for g in opt.param_groups for p in g["params"]]
    if not all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in ps):
        return False
    for g in opt.param_groups:
        if g.get("differentiable") or g.get("capturable"):
            return False
        g["fused"], g["foreach"] = True, False
    for p in ps:  # steps restored for the foreach kernel: the fused one keeps them as float32 on the parameter's device
        st = opt.state.get(p, {})
        if "step" in st:
            st["step"] = torch.as_tensor(st["step"], dtype=torch.float32).to(p.device)
    opt.grad_scale = None
    return True


PLOT_EVERY_S = 30.0  # the loss curve is redrawn at most this often during a run, and always at its end


class NonFiniteError(ValueError):
    """A loss or the gradient stopped being a finite number: training stops before the step that would spread it."""


def _check_finite(values: dict[str, float], grad_norm: float, cfg: LoopConfig, desc: str, step: int) -> None:
    """Stops training at the first non-finite loss or gradient norm, before the optimiser step and before anything
    of the epoch is saved: the last checkpoint in train_state stays the last good one. Every rank sees the same
    values (mean losses, all-reduced gradients), so every rank stops at the same step."""
    bad = [k for k, v in values.items() if not math.isfinite(v)]
    if not bad and math.isfinite(grad_norm):
        return
    what = f"loss {', '.join(f'{k} = {values[k]}' for k in bad)}" if bad else f"gradient norm {grad_norm}"
    every = sync_steps(cfg)
    when = "before the optimiser step" if every == 1 else \
        f"at the read that follows it (--sync-every {every}; its update was skipped where the optimiser allows)"
    raise NonFiniteError(f"{cfg.name}: the {what} is not finite at {desc}, global step {step}; stopped {when}, "
                         "and nothing of this epoch was saved (the last checkpoint in train_state, if "
                         "any, is the last good one). Lower the learning rate (--lr-*), or check the features and "
                         "the inputs for NaNs")


def _end_epoch(out: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, rng: np.random.Generator,
               generator: torch.Generator | None, cfg: LoopConfig, rec: dict, progress: dict,
               steps: list[dict], plotted: list[float] | None = None, last: bool = True) -> None:
    """Appends the epoch's record (train_log.jsonl) and its steps' losses (train_steps.jsonl), saves the state with
    the logs' sizes, and redraws the curve: after the run's last epoch, and otherwise at most every PLOT_EVERY_S
    (drawing takes a few tenths of a second, more than a short epoch). A run killed mid-epoch repeats that epoch on
    resume, and its steps were never written; one killed after the logs but before the state has its logs cut back
    to the state's sizes on resume (`cut_logs`), so every epoch is logged once. Data-parallel: rank 0 writes
    (atomically), the others wait for it."""
    save_rank_rng(out / "train_state", cfg.env, _at(progress))
    if not cfg.env.is_main:
        barrier(cfg.env)
        return
    log.info("%s %s", cfg.name, rec)
    _append(out / "train_log.jsonl", json.dumps(rec) + "\n")
    _append(out / "train_steps.jsonl", "".join(json.dumps(r) + "\n" for r in steps))
    save_training_state(out / "train_state", model, opt, rng, {**progress, "logs": _log_sizes(out)},
                        extra_tensors=None if generator is None else {"generator": generator.get_state()})
    due = plotted is None or last or time.monotonic() - plotted[0] >= PLOT_EVERY_S
    if cfg.plot_keys and due:
        if plotted is not None:
            plotted[0] = time.monotonic()
        recs = [json.loads(line) for line in (out / "train_steps.jsonl").read_text().splitlines() if line.strip()]
        phase_key = next(iter(progress), "stage") if progress and next(iter(progress)) != "epoch" else "stage"
        try:
            plot_losses(out / "loss_curve.png", recs, cfg.plot_keys, title=cfg.plot_title, phase_key=phase_key)
        except OSError as exc:
            raise _write_failed(out / "loss_curve.png", exc) from None
    barrier(cfg.env)


def _append(path: Path, text: str) -> None:
    """Appends to a log; a failed write (full disk, read-only folder) is a `WriteError` naming the file. What it
    left half-written is cut back on the rerun (`cut_logs`): the state saved before it is intact."""
    try:
        with path.open("a") as f:
            f.write(text)
    except OSError as exc:
        raise _write_failed(path, exc) from None

