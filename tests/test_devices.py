"""Issue 22: every trainer runs on the device it is given, and nothing a training step touches is left on the CPU
while the model is elsewhere. Checked on the CPU alone, two ways:

* `FactoryRecorder` (a TorchFunctionMode) records every tensor that foco's own code creates during training without
  naming its device (`torch.zeros(n)`, `torch.arange(b)`, `torch.tensor([...])`). On a GPU such a tensor lands on
  the CPU: a collective that gets it fails under nccl (the `sizes` of `gather_rows` before issue 22), and an op that
  mixes it with the model's tensors fails. On the CPU nothing fails, but the recorder sees the call, whatever the
  device. It is active over every epoch of every trainer here, and on two gloo ranks in
  tests/test_distributed.py::test_a_short_two_rank_run_reaches_the_single_process_weights.
* `DeviceMix` (a TorchDispatchMode) runs one step and its backward of each FoCo stage with the model on the `meta`
  device and records every aten op that takes a CPU tensor (other than a 0-dim scalar, which CUDA ops accept) and a
  meta one: a batch, a loss term or a plan that was not moved to the model's device. The meta device cannot run the
  whole loop (`.item()`, data-dependent shapes), so this check runs the steps alone; the recorder runs the loop.
"""
from __future__ import annotations

import os
import sys
import traceback
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import foco
import foco.train.loop as loop

SRC = str(Path(foco.__file__).resolve().parent)
TORCH = str(Path(torch.__file__).resolve().parent)
FACTORIES = {torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.tensor, torch.as_tensor,
             torch.randperm, torch.rand, torch.randn, torch.randint, torch.eye, torch.linspace}


class FactoryRecorder(TorchFunctionMode):
    """Records (file:line, factory) for every tensor foco's code creates without a `device=`."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and "device" not in kwargs:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(TORCH):
                frame = frame.f_back
            if frame is not None and frame.f_code.co_filename.startswith(SRC):
                where = f"{os.path.relpath(frame.f_code.co_filename, SRC)}:{frame.f_lineno}"
                self.found.append(f"{where} {func.__name__}")
        return func(*args, **kwargs)


@pytest.fixture
def recorder(monkeypatch):
    """Every training epoch of the test runs under a FactoryRecorder."""
    rec = FactoryRecorder()
    epoch = loop._epoch

    def recorded(*args, **kwargs):
        with rec:
            return epoch(*args, **kwargs)

    monkeypatch.setattr(loop, "_epoch", recorded)
    return rec


def test_the_recorder_sees_a_tensor_made_without_its_device(recorder):
    """The check can fail: a step that builds its labels with a bare torch.arange is named, file and line."""
    from foco.train.loop import LoopConfig, Phase, run
    w = torch.nn.Parameter(torch.ones(3))

    def step(idx):
        return {"loss": (w * torch.arange(3)).sum() + 0 * idx.sum()}  # the bug: arange without device

    import tempfile
    with tempfile.TemporaryDirectory() as d:
        run(torch.nn.ParameterList([w]), [Phase(1, lambda: torch.optim.SGD([w], lr=0.1), step)], d,
            LoopConfig(4, 2), __import__("numpy").random.default_rng(0))
    assert recorder.found == []  # the test's own file is not foco's: only foco's code is recorded
    from foco.train.distributed import DistEnv, gather_rows
    with recorder:
        torch.zeros(2)  # from a test: not recorded
    assert recorder.found == []
    with recorder:
        from foco.train import losses
        losses.plan_negatives(torch.ones(4, 2, dtype=torch.bool))  # foco code that names its devices
    assert recorder.found == []
    assert gather_rows(torch.ones(2, 3), DistEnv()).shape == (2, 3)


class DeviceMix(TorchDispatchMode):
    """Records every aten op that mixes CPU tensors (not 0-dim scalars) with tensors of another device."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        leaves, _ = tree_flatten((args, kwargs or {}))
        devices = {t.device.type for t in leaves if isinstance(t, torch.Tensor) and not
                   (t.device.type == "cpu" and t.ndim == 0)}
        if "cpu" in devices and len(devices) > 1:
            self.found.append(f"{func} on {sorted(devices)}")
        return func(*args, **(kwargs or {}))


class _Stepped(Exception):
    pass


def test_foco_steps_touch_nothing_on_the_cpu_when_the_model_is_elsewhere(monkeypatch, tiny_world, train_features,  # noqa: F811
                                                                        small_edit_table):  # noqa: F811
    """One step and its backward of each FoCo stage (1, 2 and the edit stage) with the model on `meta`."""
    from foco.model import FoCoConfig
    from foco.train.data import build_pair_table
    from foco.train.foco import FoCoTrainConfig, train_foco
    from foco.world.decompositions import world_decompositions
    mix, stepped = DeviceMix(), []

    def one_step_each(model, phases, out, cfg, rng, *rest):
        assert {p.device.type for p in model.parameters()} == {"meta"}
        for phase in phases:
            phase.optimizer()
            with mix:
                losses = phase.step(torch.arange(cfg.batch_size))
                losses[phase.objective].backward()
            assert {v.device.type for v in losses.values()} == {"meta"}
            stepped.append(phase.tag)
        raise _Stepped

    monkeypatch.setattr(loop, "_run", one_step_each)
    table = build_pair_table(train_features, world_decompositions(tiny_world, "train"))
    cfg = FoCoTrainConfig(stage1_epochs=1, stage2_epochs=1, stage3_epochs=1, batch_size=16, max_negatives=5,
                          model=FoCoConfig(learn_bias=True), device="meta")
    with pytest.raises(_Stepped):
        train_foco(table, "unused", cfg, edits=small_edit_table)
    assert stepped == [{"stage": 1}, {"stage": 2}, {"stage": 3}]
    assert mix.found == [], "\n".join(mix.found)
    with pytest.raises(_Stepped):  # all negatives, and the naive negatives of ablation 2b/2c
        train_foco(table, "unused", replace(cfg, max_negatives=None, negatives="naive", stage3_epochs=0))
    assert mix.found == [], "\n".join(mix.found)


def test_device_auto_and_refusals(monkeypatch):
    from foco.utils.device import resolve_device
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(ValueError, match=r"--device cuda: CUDA is not available.*--device cpu"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match=r"--device 'gpu0' is not a torch device"):
        resolve_device("gpu0")


@pytest.mark.parametrize("command", [
    ["features", "extract", "--help"], ["train", "--help"], ["pic2word", "train", "--help"],
    ["pact", "train", "--help"], ["tscir", "train", "--help"], ["backbone", "train", "--help"],
    ["backbone", "eval", "--help"], ["ablate", "--help"], ["quickstart", "--help"], ["eval", "--help"],
    ["index", "build", "--help"], ["index", "update", "--help"], ["search", "--help"], ["serve", "--help"]])
def test_every_command_that_runs_a_model_takes_device(command, capsys):
    from foco.cli import main
    with pytest.raises(SystemExit):
        main(command)
    assert "--device" in capsys.readouterr().out


# --- on a GPU (skipped without one; experiments/gpu_check.sh runs them) ---------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_cuda_foco_training_matches_the_cpu(tiny_world, train_features, tmp_path):  # noqa: F811
    from foco.model import ComposedQueryEncoder
    from foco.train.data import build_pair_table
    from foco.train.foco import FoCoTrainConfig, train_foco
    from foco.world.decompositions import world_decompositions
    table = build_pair_table(train_features, world_decompositions(tiny_world, "train"))
    cfg = FoCoTrainConfig(stage1_epochs=1, stage2_epochs=1, batch_size=32, max_steps=3, max_negatives=7)
    cpu = train_foco(table, tmp_path / "cpu", replace(cfg, device="cpu"))
    gpu = train_foco(table, tmp_path / "gpu", replace(cfg, device="cuda"))
    assert next(gpu.parameters()).device.type == "cuda"
    for (n, a), (_, b) in zip(cpu.state_dict().items(), gpu.state_dict().items()):
        assert torch.allclose(a, b.cpu(), atol=1e-4), n
    assert isinstance(ComposedQueryEncoder.load(tmp_path / "gpu"), ComposedQueryEncoder)


@cuda
def test_cuda_bf16_and_compile_train(tiny_world, train_features, tmp_path):  # noqa: F811
    from foco.train.data import build_pair_table
    from foco.train.foco import FoCoTrainConfig, train_foco
    from foco.world.decompositions import world_decompositions
    table = build_pair_table(train_features, world_decompositions(tiny_world, "train"))
    train_foco(table, tmp_path / "c", FoCoTrainConfig(stage1_epochs=1, stage2_epochs=1, batch_size=32, max_steps=3,
                                                      precision="bf16", compile="inductor", device="cuda"))


@cuda
def test_cuda_extraction_writes_what_the_cpu_writes(tiny_world, tmp_path):
    from foco.backbones import create_backbone
    from foco.features import ExtractConfig, FeatureCache
    from foco.world.splits import extract_world_split
    for device in ("cpu", "cuda"):
        extract_world_split(create_backbone("world:pretrained", device), tiny_world, "val/single",
                            tmp_path / device, ExtractConfig())
    a, b = FeatureCache(tmp_path / "cpu").images(), FeatureCache(tmp_path / "cuda").images()
    assert a[0] == b[0] and torch.allclose(a[1].global_, b[1].global_, atol=2e-3)


# Every trainer from the command line with --device cpu under the FactoryRecorder: the one run of each trainer in
# tests/trainer_runs.py (FoCo's stages 1-2, its edit stage with the target-image term, Pic2Word, PACT, TSCIR,
# LinCIR, the world backbone), made once per test run; tests/test_same_checkpoints.py asserts it beside its weights.
