"""Issue 43: a training step makes no host read and one collective (DDP's own aside). Counted with
`foco.utils.syncs.StepCounter` on a forced process group of one (gloo), where the data-parallel path runs as on 8
GPUs; the marginal cost of a step is the difference between two runs that differ only in steps per epoch."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from foco.train.data import PairTable

D, P, K, L = 16, 4, 3, 6
B, EVERY = 16, 4


def _table(n: int) -> PairTable:
    g = torch.Generator().manual_seed(1)
    nt = n * K
    lengths = torch.randint(2, L + 1, (nt,), generator=g)
    local = torch.arange(nt).view(n, K).clone()
    local[::5, 2] = -1
    context = (local + 7) % nt
    context[local < 0] = -1
    return PairTable(torch.nn.functional.normalize(torch.randn(n, D, generator=g), dim=-1),
                     torch.randn(n, P, D, generator=g),
                     torch.nn.functional.normalize(torch.randn(nt, D, generator=g), dim=-1),
                     torch.randn(nt, L, D, generator=g), torch.arange(L)[None] < lengths[:, None], local, context)


@pytest.fixture
def group_of_one():
    """A real gloo process group of one, the forced data-parallel path (`--force-distributed`)."""
    import torch.distributed as dist
    from foco.train.distributed import RunContext, init_distributed
    env = init_distributed(RunContext(forced=True), timeout_s=60, setup_timeout_s=60)
    try:
        yield env
    finally:
        dist.destroy_process_group()


def _count(env, tmp_path, n: int, sync_every: int | None) -> dict:
    from foco.train.foco import FoCoTrainConfig, train_foco
    from foco.utils.syncs import StepCounter
    cfg = FoCoTrainConfig(stage1_epochs=1, stage2_epochs=1, batch_size=B, device="cpu", sync_every=sync_every)
    with StepCounter() as c:
        train_foco(_table(n), tmp_path / f"run{n}-{sync_every}", cfg, ctx=env.for_run(0, tmp_path / f"run{n}"))
    return {"reads": sum(c.reads.values()), "collectives": sum(c.collectives.values()), "by": dict(c.reads),
            "coll": dict(c.collectives)}


def test_a_data_parallel_step_reads_nothing_and_makes_one_collective(group_of_one, tmp_path):
    """Per step (two stages of 4 extra steps each): one collective (the packed gather) plus the log block's
    all-reduce every EVERY steps, and one host read every EVERY steps; the budget the issue sets."""
    small, large = _count(group_of_one, tmp_path, 4 * B, EVERY), _count(group_of_one, tmp_path, 8 * B, EVERY)
    extra_steps = 2 * 4
    reads = (large["reads"] - small["reads"]) / extra_steps
    collectives = (large["collectives"] - small["collectives"]) / extra_steps
    assert reads <= 1 / EVERY, (reads, small, large)
    assert collectives <= 1 + 1 / EVERY, (collectives, small, large)
    # the old step, for scale: ~21 reads and 11 collectives (issue 43); one read a step at --sync-every 1
    every_step = _count(group_of_one, tmp_path, 8 * B, 1)
    assert (every_step["reads"] - small["reads"]) / extra_steps > reads


def test_the_counter_counts(group_of_one):
    """The counter is not blind: a read and a collective made from a watched file are counted."""
    from foco.train.distributed import mean_across
    from foco.utils.syncs import StepCounter
    with StepCounter() as c:
        mean_across({"a": 1.0}, group_of_one)
    assert c.collectives["all_reduce"] == 1 and c.reads["tolist"] >= 1


def test_forced_and_two_rank_plans_equal_one_process():
    """The data-parallel plan drawn from the table's pair masks is the one-process plan (same generator)."""
    from foco.train.distributed import RunContext
    from foco.train.foco import _plan
    from foco.train.losses import plan_negatives
    t = _table(64)
    idx = torch.from_numpy(np.random.default_rng(0).permutation(64)[:B])
    one = plan_negatives(t.pair_mask(idx), 5, torch.Generator().manual_seed(3))
    for rank in (0, 1):
        env = RunContext(rank, 2)
        local = idx[rank * B // 2:(rank + 1) * B // 2]
        p = _plan(t, idx, local, t.pair_mask(local), 5, torch.Generator().manual_seed(3), env, False)
        assert torch.equal(p.neg_k, one.neg_k) and torch.equal(p.columns, one.columns)


def test_sharded_plans_pick_existing_pairs_and_agree_on_columns():
    """Rank-local data: every rank draws the same columns, and each row's k' is one of its pairs, uniformly."""
    from foco.train.distributed import RunContext
    from foco.train.foco import _plan
    t = _table(64)
    seen = torch.zeros(K)
    cols = []
    for rank in (0, 1):
        local = torch.arange(rank * 8, rank * 8 + 8)
        for s in range(200):
            p = _plan(t, local, local, t.pair_mask(local), 5, torch.Generator().manual_seed(s), RunContext(rank, 2),
                      True)
            own = p.neg_k[rank * 8:(rank + 1) * 8]
            assert t.pair_mask(local)[torch.arange(8), own].all()
            if s == 0:
                cols.append(p.columns)
            full = t.pair_mask(local).all(1)  # rows with all K pairs (every fifth image has 2)
            seen += torch.bincount(own[full], minlength=K)
    assert torch.equal(cols[0], cols[1])
    assert (seen / seen.sum() - 1 / K).abs().max() < 0.05



class _Rows:
    """Stored fp16 rows, as a feature cache holds them (`foco.feature_store.Rows`' interface)."""

    def __init__(self, t: PairTable, images: bool):
        self.t, self.images = t, images

    def rows(self, kind: str, idx):
        idx = torch.as_tensor(np.asarray(idx), dtype=torch.long)
        if self.images:
            return (self.t.image_global if kind == "global" else self.t.patches)[idx].half()
        return self.t.text_global[idx].half()

    def tokens(self, idx):
        idx = torch.as_tensor(np.asarray(idx), dtype=torch.long)
        return self.t.text_tokens[idx].half(), self.t.text_mask[idx]


def test_batches_for_a_gpu_are_pinned_fp16_in_the_reader_thread_and_cast_on_the_device(monkeypatch):
    """A streaming table read for CUDA keeps the stored fp16 patches and tokens and pins them in the reader thread
    (the training thread neither casts nor pins); `TrainBatch.on` casts them to float32 on the device, equal to a
    float32 read. Pinning is recorded (a CPU build of torch cannot pin)."""
    import threading
    from foco.train.data import StreamingPairTable
    t = _table(64)
    table = StreamingPairTable(_Rows(t, True), _Rows(t, False), t.local_idx, t.context_idx, D, [str(i) for i in
                                                                                                 range(64)])
    idx = torch.arange(16) * 3 % 64
    plain = table.read(idx)
    pinned_in = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pinned_in.append(threading.current_thread()) or self)
    table.for_device("cuda")
    table.prefetch([idx])
    wire = table.batch(idx)
    assert wire.patches.dtype == torch.float16 and wire.ctx_tokens.dtype == torch.float16
    assert len(pinned_in) == 6 and all(th is not threading.main_thread() for th in pinned_in)
    on = wire.on("cpu")
    for f in ("image_global", "patches", "local", "ctx_tokens"):
        assert getattr(on, f).dtype == torch.float32 and torch.equal(getattr(on, f), getattr(plain, f)), f
    assert torch.equal(on.ctx_mask, plain.ctx_mask) and torch.equal(on.local_mask, plain.local_mask)
