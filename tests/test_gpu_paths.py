"""Issue 43's smaller items, checked without a GPU: the GPU-only branches run against recording fakes of the CUDA
and nccl calls they make. `auto` takes bf16 only where it is native; every torchrun path makes its GPU current; the
nccl group raises on a timeout (blocking wait) and has a setup timeout, then the step timeout; each rank saves and
restores its own RNG states; a non-finite step read N steps later was skipped on the device; the transformers floor
is the version whose API the code calls."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("capability,native", [((7, 0), False), ((7, 5), False), ((8, 0), True), ((9, 0), True)])
def test_auto_precision_takes_bf16_only_where_a_gpu_computes_it_natively(monkeypatch, capability, native):
    """V100 (7.0) and T4 (7.5) emulate bf16, and torch.cuda.is_bf16_supported() says True for them."""
    from foco.utils import precision
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    precision.native_bf16.cache_clear()
    try:
        assert precision.resolve_precision("auto", "cuda:0") == ("bf16" if native else "fp32")
    finally:
        precision.native_bf16.cache_clear()


def test_every_torchrun_path_makes_its_gpu_current(monkeypatch):
    """`env_from_torchrun` (train, extraction, index building start there) calls set_device with cuda:LOCAL_RANK."""
    from foco.train import distributed
    from foco.utils import device as devices
    made = []
    monkeypatch.setattr(devices, "resolve_device", lambda d: torch.device("cuda:1"))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: made.append(str(d)))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    env = distributed.env_from_torchrun("cuda")
    assert env.device == "cuda:1" and made == ["cuda:1"] and env.enabled


def test_an_nccl_group_waits_longer_during_setup_and_leaves_blocking_wait_to_the_user(monkeypatch):
    """The group is made with the setup timeout and records the step timeout; TORCH_NCCL_BLOCKING_WAIT (a Python
    error on a timeout, at the price of a host wait per collective) is the user's choice, never set here."""
    import os
    from foco.train import distributed
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group",
                        lambda backend, **kw: calls.append((backend, kw["timeout"].total_seconds(), kw["device_id"])))
    monkeypatch.delenv("TORCH_NCCL_BLOCKING_WAIT", raising=False)
    env = distributed.init_distributed(distributed.RunContext(0, 2, "cuda:0"), timeout_s=300)
    assert calls == [("nccl", distributed.SETUP_TIMEOUT_S, torch.device("cuda:0"))]
    assert "TORCH_NCCL_BLOCKING_WAIT" not in os.environ and env.step_timeout_s == 300


def test_steady_sets_the_step_timeout_on_a_real_group():
    """A gloo group of one (the forced path): the setup timeout first, the step timeout once steady."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_group
    from foco.train.distributed import RunContext, init_distributed, steady
    env = init_distributed(RunContext(forced=True), timeout_s=7, setup_timeout_s=99)
    try:
        assert env.enabled and dist.get_world_size() == 1
        assert steady(env) == 7
        from foco.train.distributed import relax
        assert relax(env) == 99 and steady(env) == 7
        x = torch.ones(3)
        dist.all_reduce(x)  # the group still works after the change
        assert torch.equal(x, torch.ones(3))
    finally:
        dist.destroy_process_group()


def test_each_rank_saves_and_restores_its_own_rng_states(tmp_path, monkeypatch):
    """The CUDA RNG state is per rank: rank 1's is not rank 0's, and each comes back on resume."""
    from foco.train.distributed import RunContext
    from foco.train.loop import load_rank_rng, save_rank_rng
    cuda = {"state": torch.zeros(8, dtype=torch.uint8)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": cuda["state"].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device="cuda": cuda.update(state=s.clone()))
    saved = {}
    at = {"stage": 2, "epoch": 3}
    for rank in (0, 1):
        torch.manual_seed(10 + rank)
        cuda["state"] = torch.full((8,), rank + 1, dtype=torch.uint8)
        save_rank_rng(tmp_path, RunContext(rank, 2), at)
        saved[rank] = (torch.get_rng_state(), cuda["state"].clone())
    for rank in (1, 0):
        torch.manual_seed(0)
        cuda["state"] = torch.zeros(8, dtype=torch.uint8)
        assert load_rank_rng(tmp_path, RunContext(rank, 2), at)
        assert torch.equal(torch.get_rng_state(), saved[rank][0]) and torch.equal(cuda["state"], saved[rank][1])
    assert not load_rank_rng(tmp_path, RunContext(0, 1), at)  # one process: the main state holds them
    # files of another epoch (the job stopped between them and rank 0's state), or none: ranks still differ
    drawn = []
    for rank in (0, 1):
        torch.manual_seed(0)
        assert not load_rank_rng(tmp_path, RunContext(rank, 2), {"stage": 2, "epoch": 2})
        drawn.append(torch.rand(4))
    assert not torch.equal(drawn[0], drawn[1])


def test_a_non_finite_step_read_later_was_skipped_on_the_device(tmp_path):
    """--sync-every 3: the NaN at the last step of a block is found at its read; the fused optimiser skipped its
    update on the device, so the weights are those before it, and nothing of the epoch was saved."""
    from test_train_loop import B, N, _toy
    from foco.train.loop import LoopConfig, NonFiniteError, run
    model, phases, gen = _toy()
    real, calls, before = phases[0].step, [], {}

    def step(idx):
        calls.append(1)
        losses = real(idx)
        if len(calls) == N // B + 3:  # epoch 2, step 3, the end of the epoch: its block is read after it
            before.update({k: v.detach().clone() for k, v in model.state_dict().items()})
            losses = {k: v * float("nan") for k, v in losses.items()}
        return losses
    phases[0].step = step
    with pytest.raises(NonFiniteError, match=r"global step 5; stopped at the read that follows it \(--sync-every 3"):
        run(model, phases, tmp_path / "a", LoopConfig(N, B, warmup_frac=0.3, sync_every=3), np.random.default_rng(0),
            False, gen)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_transformers_floor_is_the_version_whose_api_the_code_calls():
    """hf.py loads with `dtype=` (transformers 4.56; `torch_dtype=` before): every extra's floor is at least that."""
    hf = (ROOT / "src/foco/backbones/hf.py").read_text()
    floors = re.findall(r'"transformers>=([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert floors and "dtype=dtype" in hf
    assert all(tuple(int(x) for x in f.split(".")) >= (4, 56) for f in floors), floors


def test_a_loss_present_in_some_steps_only_is_logged_where_it_is(tmp_path):
    """The edit stage's target-image term exists only in batches that have a retrieved target: the block of rows
    is read when a step's losses differ, and every step is logged with its own losses."""
    from test_train_loop import B, N, _toy
    from foco.train.loop import LoopConfig, run
    model, phases, gen = _toy()
    real, calls = phases[0].step, []

    def step(idx):
        calls.append(1)
        losses = real(idx)
        return {**losses, "extra": losses["loss"] * 0.5} if len(calls) % 2 else losses
    phases[0].step = step
    seen = []
    run(model, phases, tmp_path / "a", LoopConfig(N, B, warmup_frac=0.3, sync_every=4), np.random.default_rng(0),
        False, gen, on_step=lambda s, losses: seen.append((s, sorted(losses))))
    assert [s for s, _ in seen] == list(range(len(seen))) and len(seen) == 2 * (N // B) + 3 * (N // B)
    assert [k for s, k in seen[:2 * (N // B)]] == [["double", "extra", "loss"], ["double", "loss"]] * (N // B)
