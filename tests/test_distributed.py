"""Data-parallel FoCo training (issue 15) on 2 gloo processes against one process on the same global batch:
the same losses and gradients (stage 1 and stage 2, all negatives and capped), a short run to the same weights, and
a rank killed mid-epoch: the other stops with a clear message, and --resume ends bit-identical to an uninterrupted
2-process run."""
from __future__ import annotations

import os
import signal
import traceback
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from foco.model import ComposedQueryEncoder, FoCoConfig
from foco.train.data import PairTable
from foco.train.foco import FoCoTrainConfig, train_foco

D, P, K, L = 16, 4, 3, 6


def _table(n: int = 64) -> PairTable:
    g = torch.Generator().manual_seed(123)
    image = torch.nn.functional.normalize(torch.randn(n, D, generator=g), dim=-1)
    patches = torch.randn(n, P, D, generator=g)
    nt = n * K
    text = torch.nn.functional.normalize(torch.randn(nt, D, generator=g), dim=-1)
    tokens = torch.randn(nt, L, D, generator=g)
    lengths = torch.randint(2, L + 1, (nt,), generator=g)
    mask = torch.arange(L)[None] < lengths[:, None]
    local = torch.arange(nt).view(n, K).clone()
    local[::5, 2] = -1  # some images have fewer pairs
    context = (local + 7) % nt
    context[local < 0] = -1
    return PairTable(image, patches, text, tokens, mask, local, context)


def _rendezvous(tmp_path: Path) -> str:
    """A fresh file for the process group's rendezvous: no TCP port to race for between tests."""
    import uuid
    return str(tmp_path / f"rendezvous-{uuid.uuid4().hex}")


def _init(rank: int, world: int, rendezvous: str, timeout_s: float = 60) -> None:
    import datetime
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def _finish(rank: int, world: int) -> None:
    """Every rank leaves the process group together, then the worker ends without the interpreter's teardown: its
    results are on disk, and torch's C++ teardown after collectives with autograd can abort a finished process
    ("terminate called without an active exception"), which would fail a test whose work succeeded."""
    from foco.train.distributed import DistEnv, shutdown
    shutdown(DistEnv(rank, world))
    os._exit(0)


def _backward_and_report(losses: dict, model: torch.nn.Module, env, out: str) -> None:
    """Backpropagates the rank's loss; rank 0 writes the gradients (`out`) and the losses averaged over ranks
    (`out`.json)."""
    import json
    from foco.train.distributed import mean_across
    losses["loss"].backward()
    values = mean_across({k: float(v.detach()) for k, v in losses.items()}, env)
    if env.rank == 0:
        from safetensors.torch import save_file
        save_file({n: p.grad.contiguous() for n, p in model.named_parameters() if p.grad is not None}, out)
        Path(out + ".json").write_text(json.dumps(values))


def _grads_single(stage: int, max_neg):
    from foco.train.losses import foco_losses, plan_negatives
    torch.manual_seed(0)
    model = ComposedQueryEncoder(FoCoConfig(dim=D, heads=4, learn_bias=True))
    table, gen = _table(), torch.Generator().manual_seed(5)
    batch = table.batch(torch.arange(16) * 3 % 64)
    losses = foco_losses(model, batch, plan_negatives(batch.local_mask, max_neg, gen), stage == 2)
    losses["loss"].backward()
    return {k: float(v.detach()) for k, v in losses.items()}, {n: p.grad.clone() for n, p in model.named_parameters()
                                                       if p.grad is not None}


def _grads_worker(rank: int, world: int, rendezvous: str, stage: int, max_neg, out: str) -> None:
    try:
        _init(rank, world, rendezvous)
        from foco.train.distributed import DistEnv
        from foco.train.foco import FoCoObjective, distributed_step
        torch.manual_seed(0)
        model = ComposedQueryEncoder(FoCoConfig(dim=D, heads=4, learn_bias=True))
        ddp = torch.nn.parallel.DistributedDataParallel(FoCoObjective(model), find_unused_parameters=True)
        env = DistEnv(rank, world)
        losses = distributed_step(ddp, _table(), torch.arange(16) * 3 % 64, max_neg, torch.Generator().manual_seed(5),
                                  stage == 2, env)
        _backward_and_report(losses, model, env, out)
        _finish(rank, world)
    except Exception:
        traceback.print_exc()
        raise


@pytest.mark.slow  # two processes or a training run: about 4-5 s each (issue 53: make test-fast within 2 minutes)
@pytest.mark.parametrize("stage,max_neg", [(1, None), (2, None), (2, 7)])
def test_two_ranks_compute_the_single_process_losses_and_gradients(stage, max_neg, tmp_path):
    import json
    from safetensors.torch import load_file
    out = str(tmp_path / "grads.safetensors")
    mp.start_processes(_grads_worker, args=(2, _rendezvous(tmp_path), stage, max_neg, out), nprocs=2, start_method="spawn")
    want_losses, want = _grads_single(stage, max_neg)
    got, got_losses = load_file(out), json.loads(Path(out + ".json").read_text())
    assert set(got) == set(want)
    for k, v in want_losses.items():
        assert abs(got_losses[k] - v) < 1e-5, (k, got_losses[k], v)
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-5, rtol=0), (name, (got[name] - want[name]).abs().max())
        if name.endswith("k_proj.bias"):  # softmax is shift-invariant: a key bias has no gradient but float noise
            assert want[name].abs().max() < 1e-6 and got[name].abs().max() < 1e-6


def _noise_only(name: str) -> bool:
    """Key-projection biases: their exact gradient is zero (see above), so AdamW moves them by float noise, in
    one process as in two; every other weight must agree."""
    return name.endswith("k_proj.bias")


CFG = FoCoTrainConfig(stage1_epochs=2, stage2_epochs=2, batch_size=16, lr_stage1=1e-3, lr_aggr=1e-3, lr_comp=1e-3,
                      max_negatives=7, model=FoCoConfig(heads=4, learn_bias=True))


def _train_worker(rank: int, world: int, rendezvous: str, out: str, resume: bool, die_at: int | None,
                  timeout_s: float) -> None:
    _init(rank, world, rendezvous, timeout_s)

    def on_step(step, losses):
        if die_at is not None and rank == 1 and step == die_at:
            os.kill(os.getpid(), signal.SIGKILL)
    import json
    import foco.train.loop as loop
    from test_devices import FactoryRecorder
    rec, epoch = FactoryRecorder(), loop._epoch

    def recorded(*args, **kwargs):  # every epoch under the recorder of tensors made without their device
        with rec:
            return epoch(*args, **kwargs)
    loop._epoch = recorded
    try:
        train_foco(_table(128), out, CFG, resume=resume, on_step=on_step)
    except Exception as exc:
        Path(f"{out}.rank{rank}.err").write_text(str(exc))
        raise
    Path(f"{out}.rank{rank}.factories.json").write_text(json.dumps(rec.found))
    _finish(rank, world)


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file
    return load_file(str(folder / "foco.safetensors"))


@pytest.mark.slow
def test_a_short_two_rank_run_reaches_the_single_process_weights(tmp_path):
    train_foco(_table(128), tmp_path / "one", CFG)
    mp.start_processes(_train_worker, args=(2, _rendezvous(tmp_path), str(tmp_path / "two"), False, None, 60), nprocs=2,
                       start_method="spawn")
    a, b = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    for name in a:
        if not _noise_only(name):
            assert torch.allclose(a[name], b[name], atol=1e-4, rtol=0), (name, (a[name] - b[name]).abs().max())
    # issue 22: no collective, batch or loss tensor of either rank was made without its device (tests/test_devices.py)
    import json
    found = [f for r in range(2) for f in json.loads(Path(f"{tmp_path / 'two'}.rank{r}.factories.json").read_text())]
    assert found == [], "\n".join(sorted(set(found)))


@pytest.mark.slow
def test_a_killed_rank_stops_the_job_and_resume_is_bitwise(tmp_path):
    import time
    ctx = mp.get_context("spawn")
    rendezvous = _rendezvous(tmp_path)
    procs = [ctx.Process(target=_train_worker, args=(r, 2, rendezvous, str(tmp_path / "cut"), False, 11, 20))
             for r in range(2)]
    t0 = time.time()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert procs[1].exitcode == -signal.SIGKILL  # killed mid-epoch (8 steps per epoch: step 11 is in epoch 2)
    assert procs[0].exitcode not in (None, 0) and time.time() - t0 < 120  # stopped, did not hang
    message = Path(f"{tmp_path / 'cut'}.rank0.err").read_text()
    assert "another rank stopped or did not answer" in message and "Rerun the same torchrun command" in message
    state = tmp_path / "cut" / "train_state"
    assert state.is_dir()
    mp.start_processes(_train_worker, args=(2, _rendezvous(tmp_path), str(tmp_path / "cut"), True, None, 60), nprocs=2,
                       start_method="spawn")
    mp.start_processes(_train_worker, args=(2, _rendezvous(tmp_path), str(tmp_path / "whole"), False, None, 60), nprocs=2,
                       start_method="spawn")
    a, b = _weights(tmp_path / "cut"), _weights(tmp_path / "whole")
    assert all(torch.equal(a[k], b[k]) for k in a)


def _p2w_grads(images: torch.Tensor, distributed: bool, rank: int = 0, world: int = 1):
    from foco.backbones import create_backbone
    from foco.methods.pic2word import Pic2WordConfig, Pic2WordMapper
    from foco.train.distributed import DistEnv
    from foco.train.pic2word import Pic2WordObjective
    backbone = create_backbone("world:pretrained")
    torch.manual_seed(0)
    mapper = Pic2WordMapper(Pic2WordConfig(image_dim=images.shape[1], token_dim=backbone.token_dim))
    mapper.eval()  # dropout off: each rank draws its own masks, so only the deterministic computation can match
    objective = Pic2WordObjective(mapper, backbone, "a photo of *", "*", 0.07)
    env = DistEnv(rank, world)
    if distributed:
        objective = torch.nn.parallel.DistributedDataParallel(objective)
        b = images.shape[0] // world
        images = images[rank * b:(rank + 1) * b]
    if distributed:
        loss = objective(images, images, env)["loss"]  # raw inputs; the loss normalises its images
    else:  # the texts encoded in the ranks' halves: MiniLM's backward alone differs by ~0.3 % between a batch of
        # 16 and two of 8 in one process, so the reference must batch the text tower as the ranks do
        import torch.nn.functional as F
        from foco.train.pic2word import pic2word_loss
        texts = torch.cat([backbone.encode_texts_with_tokens(["a photo of *"] * 8, mapper(h), "*").global_
                           for h in images.split(8)])
        loss = pic2word_loss(F.normalize(images, dim=-1), texts, 0.07)
    loss.backward()
    return loss, {n: p.grad.clone() for n, p in mapper.named_parameters()}


def _p2w_worker(rank: int, world: int, rendezvous: str, out: str) -> None:
    _init(rank, world, rendezvous)
    from foco.train.distributed import DistEnv, mean_across
    images = torch.randn(16, 256, generator=torch.Generator().manual_seed(9))
    loss, grads = _p2w_grads(images, True, rank, world)
    value = mean_across({"loss": float(loss.detach())}, DistEnv(rank, world))
    if rank == 0:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in grads.items()}, out)
        Path(out + ".json").write_text(__import__("json").dumps(value))
    _finish(rank, world)


@pytest.mark.slow
def test_pic2word_on_two_ranks_matches_one_process(tmp_path):
    """Pic2Word's texts come out of the trained mapper, so they are gathered with their gradient."""
    import json
    from safetensors.torch import load_file
    out = str(tmp_path / "p2w.safetensors")
    mp.start_processes(_p2w_worker, args=(2, _rendezvous(tmp_path), out), nprocs=2, start_method="spawn")
    images = torch.randn(16, 256, generator=torch.Generator().manual_seed(9))
    loss, want = _p2w_grads(images, False)
    got = load_file(out)
    assert abs(json.loads(Path(out + ".json").read_text())["loss"] - float(loss.detach())) < 1e-5
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-5, rtol=1e-4), (name, (got[name] - want[name]).abs().max())


def _edit_batch(rows=None):
    from foco.backbones.base import ImageFeatures, TextFeatures
    from foco.train.edit_data import EditBatch
    g = torch.Generator().manual_seed(77)
    n = 16
    norm = torch.nn.functional.normalize
    ref = ImageFeatures(norm(torch.randn(n, D, generator=g), dim=-1), torch.randn(n, P, D, generator=g))
    mask = torch.arange(L)[None] < torch.randint(2, L + 1, (n,), generator=g)[:, None]
    ins = TextFeatures(norm(torch.randn(n, D, generator=g), dim=-1), torch.randn(n, L, D, generator=g), mask)
    has = torch.rand(n, generator=g) < 0.6
    batch = EditBatch(ref, ins, norm(torch.randn(n, D, generator=g), dim=-1),
                      norm(torch.randn(n, 2, D, generator=g), dim=-1), torch.rand(n, 2, generator=g) < 0.8,
                      [f"t{i}" for i in range(n)], norm(torch.randn(n, D, generator=g), dim=-1) * has[:, None], has)
    if rows is None:
        return batch
    return EditBatch(ImageFeatures(ref.global_[rows], ref.patches[rows]),
                     TextFeatures(ins.global_[rows], ins.tokens[rows], ins.mask[rows]), batch.target[rows],
                     batch.negatives[rows], batch.negative_mask[rows], [batch.texts[i] for i in rows.tolist()],
                     batch.target_image[rows], batch.has_target_image[rows])


EDIT_KW = dict(temperature=0.05, preserve_weight=0.3, use_negatives=True, image_weight=0.3)


def _edit_worker(rank: int, world: int, rendezvous: str, out: str) -> None:
    _init(rank, world, rendezvous)
    from foco.train.distributed import DistEnv
    from foco.train.foco import FoCoObjective
    torch.manual_seed(0)
    model = ComposedQueryEncoder(FoCoConfig(dim=D, heads=4, learn_bias=True))
    ddp = torch.nn.parallel.DistributedDataParallel(FoCoObjective(model), find_unused_parameters=True)
    env = DistEnv(rank, world)
    losses = ddp(_edit_batch(torch.arange(8) + 8 * rank), edit={**EDIT_KW, "env": env})
    _backward_and_report(losses, model, env, out)
    _finish(rank, world)


@pytest.mark.slow  # two processes or a training run: about 4-5 s each (issue 53: make test-fast within 2 minutes)
def test_the_edit_stage_on_two_ranks_matches_one_process(tmp_path):
    """foco-edits' stage 3: targets, sources and target images gathered as features, queries with their gradient."""
    import json
    from safetensors.torch import load_file
    from foco.train.losses import edit_losses
    out = str(tmp_path / "edit.safetensors")
    mp.start_processes(_edit_worker, args=(2, _rendezvous(tmp_path), out), nprocs=2, start_method="spawn")
    torch.manual_seed(0)
    model = ComposedQueryEncoder(FoCoConfig(dim=D, heads=4, learn_bias=True))
    losses = edit_losses(model, _edit_batch(), **EDIT_KW)
    losses["loss"].backward()
    got, got_losses = load_file(out), json.loads(Path(out + ".json").read_text())
    for k, v in losses.items():
        assert abs(got_losses[k] - float(v.detach())) < 1e-5, (k, got_losses[k], float(v))
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert torch.allclose(got[name], p.grad, atol=1e-5, rtol=0), (name, (got[name] - p.grad).abs().max())


@pytest.mark.slow
def test_compile_trains_to_the_same_weights(tmp_path):
    """--compile (for GPUs) runs the same losses through torch.compile; the weights stay the model's. The test
    traces with the aot_eager backend (dynamo capture and AOTAutograd, the whole graph path without code generation):
    inductor's C++ code generation takes minutes on this CPU, too long for the suite."""
    from dataclasses import replace
    short = replace(CFG, stage1_epochs=1, stage2_epochs=1)
    train_foco(_table(64), tmp_path / "plain", short)
    train_foco(_table(64), tmp_path / "compiled", replace(short, compile="aot_eager"))
    a, b = _weights(tmp_path / "plain"), _weights(tmp_path / "compiled")
    assert set(a) == set(b)  # no "_orig_mod." prefixes: the checkpoint is the model's
    for name in a:
        if not _noise_only(name):
            assert torch.allclose(a[name], b[name], atol=1e-4, rtol=0), (name, (a[name] - b[name]).abs().max())


def _local_worker(rank: int, world: int, rendezvous: str, out: str, epochs: int, resume: bool) -> None:
    _init(rank, world, rendezvous)
    import json
    import numpy as np
    from foco.train.distributed import DistEnv
    from foco.train.loop import LoopConfig, Phase, run
    n_local = [40, 27][rank]  # ranks hold different amounts of their own data
    model = torch.nn.Linear(2, 1)
    seen = []

    def step(idx):
        seen.append(idx.tolist())
        return {"loss": (model(torch.ones(len(idx), 2)) * 0).sum()}

    phase = Phase(epochs, lambda: torch.optim.SGD(model.parameters(), lr=0.1), step, local=True)
    run(model, [phase], out, LoopConfig(n_local, 8, env=DistEnv(rank, world)), np.random.default_rng(0), resume)
    Path(out, f"seen.{rank}.{epochs}.json").write_text(json.dumps(seen))
    _finish(rank, world)


@pytest.mark.slow
def test_ranks_on_their_own_data_take_equal_steps_and_resume_the_same_orders(tmp_path):
    """`foco train --in` under torchrun: each rank reads its own feature shards (a local phase). Every rank takes
    B/N of its own examples per step, all take the fewest steps any rank's data allows, their orders differ, and a
    resumed run draws the orders of an uninterrupted one."""
    import json
    whole, cut = str(tmp_path / "whole"), str(tmp_path / "cut")
    mp.start_processes(_local_worker, args=(2, _rendezvous(tmp_path), whole, 2, False), nprocs=2, start_method="spawn")
    mp.start_processes(_local_worker, args=(2, _rendezvous(tmp_path), cut, 1, False), nprocs=2, start_method="spawn")
    mp.start_processes(_local_worker, args=(2, _rendezvous(tmp_path), cut, 2, True), nprocs=2, start_method="spawn")
    seen = {r: json.loads(Path(whole, f"seen.{r}.2.json").read_text()) for r in range(2)}
    steps = min(40, 27) // 4  # B/N = 4; the smaller rank's data decides
    for r, n in ((0, 40), (1, 27)):
        assert len(seen[r]) == 2 * steps and all(len(b) == 4 for b in seen[r])
        for epoch in (seen[r][:steps], seen[r][steps:]):
            flat = [i for b in epoch for i in b]
            assert len(set(flat)) == len(flat) and max(flat) < n  # an epoch draws without repeats from its own data
    assert seen[0][:steps] != seen[1][:steps]
    assert seen[0][:steps] != seen[0][steps:]  # a new order each epoch
    for r in range(2):
        resumed = json.loads(Path(cut, f"seen.{r}.2.json").read_text())
        assert resumed == seen[r][steps:]  # the resumed run repeats the uninterrupted run's second epoch
    state = json.loads((tmp_path / "whole" / "train_state" / "state.json").read_text())
    assert state["progress"]["identity"]["examples (training)"] == 67  # the run's identity counts every rank
