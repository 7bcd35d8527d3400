"""Data-parallel training on torch.distributed: `torchrun --nproc_per_node N -m foco train ...`.

Each of the N ranks holds B/N images of every global batch of B. The gradient is averaged over ranks by DDP, so
that it equals the single-process gradient of the global batch's mean loss. The cross-instance negatives span the
global batch: every rank draws the same negative plan (k' per image, the capped columns) from identically seeded
generators over the gathered masks of the global batch, so the plan is the single-process one, and computes its
rows of the B x B grid against the anchors c_jk', contexts X_jk' and image features v_g gathered from every rank.

Gathering needs no gradient because the backbone is frozen: these are cached features, not outputs of the trained
model. If a backbone (or any module that produces the gathered tensors) were ever tuned, the gather would have to
carry gradients back to the rank that produced each row (`torch.distributed.nn.all_gather`), as open_clip's
`gather_with_grad` does.

The backend follows the run's device (`foco.utils.device`): gloo on the CPU, nccl on CUDA, where each rank holds
cuda:$LOCAL_RANK and every collective takes tensors on it (`DistEnv.device`).

Timeouts. The group is made with the long setup timeout (`--setup-timeout`, default 1800 s): before the first step
one rank may work alone while the others wait (rank 0 encodes the edit texts, shards are hashed, inductor compiles).
`steady` then shortens it to the step timeout (`--dist-timeout`, default 600 s): a rank that dies mid-training stops
the others within it. On nccl, by default, the watchdog then tears the process down (torchrun reports which rank
failed); with `TORCH_NCCL_BLOCKING_WAIT=1` in the environment a timed-out collective raises a Python error instead,
which the loop turns into `RankLost` saying how to resume. It is not set for you: every collective's wait then
blocks the CPU until the GPU has done it, which is the host wait a step is built to avoid.

`--force-distributed` (`RunContext.forced`) takes the data-parallel path at world size 1: a real process group of
one (nccl on a GPU, gloo on the CPU), DDP and the gathers, so that a one-GPU machine tests what 8 GPUs run.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 600  # a step's collectives (--dist-timeout)
SETUP_TIMEOUT_S = 1800  # from joining the group to the first step (--setup-timeout)


class RankLost(RuntimeError):
    """Another rank stopped, or did not answer within the process group's timeout."""


@dataclass(frozen=True)
class RunContext:
    """One run's boundary, made once (`init_distributed` under torchrun, `context` otherwise) and passed down
    explicitly: this process's rank and the world size, its device, the run's seed and its output folder."""
    rank: int = 0
    world_size: int = 1
    device: str = "cpu"  # where this rank's model, batches and collective tensors live
    seed: int = 0
    out: str | None = None
    forced: bool = False  # the data-parallel path (process group, DDP, gathers) even at world size 1
    step_timeout_s: float | None = None  # what `steady` sets once setup is over (init_distributed records it)
    setup_timeout_s: float | None = None  # what `relax` sets again before a phase's first step (compiling)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1 or self.forced

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def for_run(self, seed: int, out: str | os.PathLike | None) -> "RunContext":
        """The same ranks and device for a run with this seed and output folder."""
        return replace(self, seed=int(seed), out=None if out is None else str(out))


DistEnv = RunContext  # the name the collectives' signatures use: only rank, world size and device matter there


def env_from_torchrun(device: str | torch.device | None = None, forced: bool = False) -> DistEnv:
    """RANK and WORLD_SIZE as torchrun sets them; one process otherwise. `device` ("auto", "cpu", "cuda", ...;
    None: "auto") is resolved by `foco.utils.device`: under torchrun with CUDA, cuda:$LOCAL_RANK, made this
    process's current GPU here (every torchrun path starts here). `forced`: the data-parallel path at world size 1."""
    from ..utils.device import resolve_device
    env = DistEnv(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                  str(resolve_device(device if device is not None else "auto")), forced=bool(forced))
    if env.torch_device.type == "cuda":
        torch.cuda.set_device(env.torch_device)
    return env


def init_distributed(env: RunContext, backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                     setup_timeout_s: float | None = None) -> RunContext:
    """Joins the process group of `env` (env:// rendezvous: MASTER_ADDR, MASTER_PORT; a forced group of one
    without torchrun makes its own on a free local port): nccl when `env.device` is CUDA (this rank's GPU made
    current), gloo otherwise. Collectives time out after `setup_timeout_s` (None: the larger of `timeout_s` and
    `SETUP_TIMEOUT_S`) until `steady` sets `timeout_s`, the step timeout. Returns `env`, the run's context, which
    the caller passes on (nothing is kept in a module global)."""
    device = env.torch_device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not env.enabled or dist.is_initialized():
        return replace(env, step_timeout_s=float(timeout_s)) if env.enabled else env
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if env.world_size == 1 and "MASTER_ADDR" not in os.environ:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(_free_port())
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    setup = setup_timeout_s if setup_timeout_s is not None else max(timeout_s, SETUP_TIMEOUT_S)
    dist.init_process_group(backend, rank=env.rank, world_size=env.world_size,
                            timeout=datetime.timedelta(seconds=setup), **kwargs)
    return replace(env, step_timeout_s=float(timeout_s), setup_timeout_s=float(setup))


@dataclass(frozen=True)
class Launch:
    """How a training run starts: its device ("auto", "cpu", "cuda", ...), the data-parallel path at world size 1
    (`forced`), and the collectives' timeouts (the step's, and the setup's until the first step; None: the
    larger of the step's and `SETUP_TIMEOUT_S`)."""
    device: str = "auto"
    forced: bool = False
    dist_timeout_s: float = DEFAULT_TIMEOUT_S
    setup_timeout_s: float | None = None


def start_run(launch: Launch, seed: int, out: str | os.PathLike | None) -> RunContext:
    """The run's context, made once: this rank's device and ranks (torchrun's, or one process), the process group
    joined when there is one, the run's seed and output folder."""
    env = env_from_torchrun(launch.device, forced=launch.forced).for_run(seed, out)
    return init_distributed(env, timeout_s=launch.dist_timeout_s, setup_timeout_s=launch.setup_timeout_s)


def group_line(env: RunContext) -> str | None:
    """What the main rank tells a user about the process group it joined (None without one)."""
    if not (env.enabled and env.is_main):
        return None
    return (f"process group: {dist.get_backend()}, {env.world_size} rank(s) on {env.device}"
            f"{' (forced: --force-distributed)' if env.world_size == 1 else ''}")


def steady(env: DistEnv) -> float | None:
    """A phase's first step is done (compiled, its columns' length agreed): the group's collectives now time out
    after the step timeout given to `init_distributed`. Returns it (None: no group, or one made elsewhere)."""
    return _set_timeout(env, env.step_timeout_s)


def relax(env: DistEnv) -> float | None:
    """Before a phase's first step, which may compile or set up alone on one rank: the setup timeout again."""
    return _set_timeout(env, env.setup_timeout_s)


def _set_timeout(env: DistEnv, seconds: float | None) -> float | None:
    if not env.enabled or seconds is None or not dist.is_initialized():
        return None
    from torch.distributed.distributed_c10d import _set_pg_timeout
    _set_pg_timeout(datetime.timedelta(seconds=seconds))
    return seconds


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def context(device: str | torch.device | None = None, seed: int = 0, out: str | os.PathLike | None = None
            ) -> RunContext:
    """The context of a run started from the library without one: the process group this process joined (one
    process when none), on `device`. None: the group's own device, read from torch (nccl: the GPU
    `init_distributed` made current; gloo: the CPU), and the CPU without a group."""
    from ..utils.device import resolve_device
    grouped = dist.is_available() and dist.is_initialized()
    if device is not None:
        dev = str(resolve_device(device))
    elif grouped and dist.get_backend() == "nccl":
        dev = f"cuda:{torch.cuda.current_device()}"
    else:
        dev = "cpu"
    if grouped:
        return RunContext(dist.get_rank(), dist.get_world_size(), dev, forced=True).for_run(seed, out)
    return RunContext(device=dev).for_run(seed, out)


def gather_rows(t: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Concatenates every rank's (b_r, ...) tensor along dim 0 in rank order -> (sum b_r, ...); no gradient (for
    cached features). Ranks may hold different row counts, and differ in dim 1 (token length): shorter ones are
    zero-padded to the longest for the collective; the padding rows are cut off again, the padded length stays."""
    if not env.enabled:
        return t
    t = t.detach().contiguous()
    sizes = torch.zeros(env.world_size + 1, dtype=torch.long, device=t.device)  # each rank's rows, the longest dim 1
    sizes[env.rank] = t.shape[0]
    sizes[-1] = t.shape[1] if t.ndim >= 2 else 0
    dist.all_reduce(sizes, op=dist.ReduceOp.MAX)
    counts, rows, length = sizes[:-1].tolist(), int(sizes[:-1].max()), int(sizes[-1])
    pad = [0, 0] * (t.ndim - 1) + [0, rows - t.shape[0]]
    if t.ndim >= 2:
        pad[-3] = length - t.shape[1]
    if any(pad):
        t = torch.nn.functional.pad(t, pad)
    parts = [torch.empty_like(t) for _ in range(env.world_size)]
    dist.all_gather(parts, t)
    return torch.cat([part[:n] for part, n in zip(parts, counts)])


def gather_packed(parts: list[torch.Tensor], env: DistEnv) -> list[torch.Tensor]:
    """Every rank's tensors `parts` (each (b, ...), the same shapes on every rank: a fixed batch share and a fixed
    token length) in ONE collective, without gradient: each is flattened to (b, n_i) float32 (bools and small ints
    exactly), the row-wise concatenation (b, sum n_i) is all-gathered into (N b, sum n_i), and split back into
    (N b, ...) tensors of the parts' dtypes, rows in rank order. No size is exchanged, so nothing is read on the
    host: the caller guarantees equal shapes (`rank_slice` and `_local_steps` give every rank B/N rows)."""
    if not env.enabled:
        return parts
    b = parts[0].shape[0]
    flat = [p.detach().reshape(b, -1).float() for p in parts]  # (b, n_i)
    widths = [f.shape[1] for f in flat]
    packed = torch.cat(flat, dim=1).contiguous()  # (b, sum n_i)
    out = torch.empty(env.world_size * b, packed.shape[1], dtype=packed.dtype, device=packed.device)
    (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(out, packed)
    return [chunk.reshape(env.world_size * b, *p.shape[1:]).to(p.dtype)
            for chunk, p in zip(out.split(widths, dim=1), parts)]


def gather_with_grad(t: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Concatenates every rank's (b_r, ...) tensor along dim 0 in rank order -> (sum b_r, ...), with gradient: for
    outputs of the trained model (queries, pseudo-word texts). The backward hands each rank the gradient of every
    rank's loss with respect to its own rows, so that, with DDP's average over ranks, each rank's loss must be its
    rows' share of the global mean (`share`). Ranks may hold different row counts (zero-padded for the collective,
    the padding cut off again)."""
    if not env.enabled:
        return t
    import torch.distributed.nn.functional as dist_nn
    counts = torch.zeros(env.world_size, dtype=torch.long, device=t.device)
    counts[env.rank] = t.shape[0]
    dist.all_reduce(counts)
    most = int(counts.max())
    padded = torch.nn.functional.pad(t, [0, 0] * (t.ndim - 1) + [0, most - t.shape[0]]) if most > t.shape[0] else t
    parts = dist_nn.all_gather(padded.contiguous())
    return torch.cat([part[:int(n)] for part, n in zip(parts, counts)])


def row_offset(rows: int, env: DistEnv) -> int:
    """Where this rank's `rows` start in the rank-ordered concatenation of every rank's rows."""
    if not env.enabled:
        return 0
    counts = torch.zeros(env.world_size, dtype=torch.long, device=env.torch_device)
    counts[env.rank] = rows
    dist.all_reduce(counts)
    return int(counts[:env.rank].sum())


def total_across(n: int, env: DistEnv, op: str = "sum") -> int:
    """The sum (or "min", "max") of an integer over ranks."""
    if not env.enabled:
        return n
    t = torch.tensor([n], dtype=torch.long, device=env.torch_device)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op])
    return int(t)


class Objective(torch.nn.Module):
    """A trained module whose training losses are computed inside `forward`, so that DDP's reducer sees them:
    `Objective(model)(lambda: losses)` returns the closure's losses. The closure uses `model` (the submodule), whose
    trainable parameters DDP registers when it wraps this."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, losses):  # losses: () -> {name: scalar}
        return losses()


def data_parallel(model: torch.nn.Module, env: DistEnv):
    """`model`'s losses under DDP (an `Objective` wrapped) when `env` has several ranks; the plain `Objective`
    otherwise. Only the parameters that require a gradient when this is called are registered, so a trainer whose
    phases train different parts wraps again at each phase."""
    objective = Objective(model)
    if not env.enabled:
        return objective
    return ddp(objective, env)


def ddp(module: torch.nn.Module, env: DistEnv, find_unused: bool = True) -> torch.nn.Module:
    """`module` (already on `env.device`) under DDP: `device_ids` on CUDA, so that its gradients are reduced on
    this rank's GPU."""
    device = env.torch_device
    ids = {"device_ids": [device.index], "output_device": device.index} if device.type == "cuda" else {}
    return torch.nn.parallel.DistributedDataParallel(module, find_unused_parameters=find_unused, **ids)


def mean_block(block: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """The mean over ranks of a block of logged values (steps, values) on the device: one all-reduce for every
    step the block holds (the loop reads its logs every N steps)."""
    if not env.enabled:
        return block
    block = block.clone()
    dist.all_reduce(block)
    return block / env.world_size


def mean_across(values: dict[str, float], env: DistEnv) -> dict[str, float]:
    """The mean of each value over ranks (each rank's mean over its own rows): for values already on the host."""
    if not env.enabled or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=env.torch_device)
    return {k: float(v) for k, v in zip(keys, mean_block(t, env).tolist())}


def barrier(env: DistEnv) -> None:
    if env.enabled:
        dist.barrier()


def rank_chunk(rows: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """This rank's contiguous part of `rows` when their count need not divide by N (`torch.tensor_split`: the
    first ranks take one more)."""
    if not env.enabled:
        return rows
    return torch.tensor_split(rows, env.world_size)[env.rank]


def rank_slice(idx: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """This rank's B/N of a global batch of indices (B must be divisible by N)."""
    if not env.enabled:
        return idx
    B = idx.shape[0]
    if B % env.world_size:
        raise ValueError(f"the global batch of {B} does not split over {env.world_size} ranks; use a --batch-size "
                         f"divisible by {env.world_size}")
    b = B // env.world_size
    return idx[env.rank * b:(env.rank + 1) * b]


def rank_lost(exc: BaseException, env: DistEnv, timeout_s: float | None = None) -> RankLost:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    within = f" within {timeout_s:g} s" if timeout_s else ""
    return RankLost(f"rank {env.rank} of {env.world_size}: another rank stopped or did not answer{within} ({first}); "
                    "the job stops here. Rerun the same torchrun command to continue from the last finished epoch")


def shutdown(env: DistEnv) -> None:
    """Leaves the process group cleanly: every rank waits for the others, then the group is destroyed, so that no
    rank exits while gloo's threads still serve a collective (which aborts the process at exit)."""
    if env.enabled and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()
