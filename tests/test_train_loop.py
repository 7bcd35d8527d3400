"""The shared training loop: its schedule, global steps, resume, and trainers that leave their config alone."""
import copy
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from foco.train.loop import LoopConfig, Phase, lr_factor, refuse_overwrite, run

N, B = 20, 6  # 3 steps an epoch, the last 2 examples dropped


def _slow_schedule(total: int, warmup_frac: float) -> list[float]:
    """The whole schedule step by step, straight from its definition (and the same float arithmetic)."""
    warm = max(1, int(total * warmup_frac))  # at least one warm-up step
    warmup = [(step + 1) / warm for step in range(min(warm, total))]
    cosine = [0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, total - warm))) for step in range(warm, total)]
    return warmup + cosine


@pytest.mark.parametrize("total", [1, 2, 3, 7, 20, 72, 234, 1000])
@pytest.mark.parametrize("warmup_frac", [0.0, 0.05, 0.3, 1.0])
def test_lr_factor_matches_its_definition(total, warmup_frac):
    assert [lr_factor(s, total, warmup_frac) for s in range(total)] == _slow_schedule(total, warmup_frac)


def _toy(log: dict | None = None):
    """A small MLP with dropout on fixed random data, two phases (AdamW on "loss", then SGD on "double"), a torch
    generator drawn from in every step. `log` collects the lr of every step per stage."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    data = torch.Generator().manual_seed(1)
    x, y = torch.randn(N, 4, generator=data), torch.randn(N, 1, generator=data)  # (N, 4), (N, 1)
    gen = torch.Generator().manual_seed(2)
    opts = {}

    def phase(stage: int, epochs: int, make) -> Phase:
        def optimizer():
            opts[stage] = make()
            return opts[stage]

        def step(idx):
            if log is not None:
                log.setdefault(stage, []).append(opts[stage].param_groups[0]["lr"])
            loss = F.mse_loss(model(x[idx] + 0.1 * torch.randn(len(idx), 4, generator=gen)), y[idx])
            return {"loss": loss, "double": 2 * loss}
        return Phase(epochs, optimizer, step, objective="loss" if stage == 1 else "double", tag={"stage": stage},
                     record=lambda global_step: {"seen": global_step})

    phases = [phase(1, 2, lambda: torch.optim.AdamW(model.parameters(), lr=1e-2)),
              phase(2, 3, lambda: torch.optim.SGD(model.parameters(), lr=5e-2, momentum=0.9))]
    return model, phases, gen


class _Killed(Exception):
    pass


def _run(out, resume=False, stop_after: int | None = None, log: dict | None = None, on_step=None, **loop_cfg):
    """Trains the toy in `out`; `stop_after` epochs (counted in this call) kills it after the state is saved."""
    model, phases, gen = _toy(log)
    epochs = []

    def on_epoch(rec):
        epochs.append(rec)
        if len(epochs) == stop_after:
            raise _Killed
    try:
        run(model, phases, out, LoopConfig(N, B, warmup_frac=0.3, **loop_cfg), np.random.default_rng(0), resume, gen,
            on_step=on_step, on_epoch=on_epoch)
    except _Killed:
        pass
    return model


@pytest.mark.parametrize("stop_after", [1, 2, 3, 4])
def test_resume_reaches_the_same_weights(tmp_path, stop_after):
    straight = _run(tmp_path / "straight")
    _run(tmp_path / "killed", stop_after=stop_after)
    with pytest.raises(FileExistsError):
        refuse_overwrite(tmp_path / "killed", False, "resume it")
    resumed = _run(tmp_path / "killed", resume=True)
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    log = [json.loads(line) for line in (tmp_path / "killed" / "train_log.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["epoch"]) for r in log] == [(1, 1), (1, 2), (2, 1), (2, 2), (2, 3)]
    assert list(log[0]) == ["stage", "epoch", "loss", "double", "seen", "elapsed_s"]
    assert [r["seen"] for r in log] == [3, 6, 9, 12, 15]


def _lines(path: Path, drop=("elapsed_s",)) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in path.read_text().splitlines()]


@pytest.mark.parametrize("torn", [False, True])
def test_a_run_killed_between_its_logs_and_its_state_logs_every_epoch_once(tmp_path, monkeypatch, torn):
    """The epoch's lines are appended, then the state is saved: a kill between the two (here: the second save
    fails) leaves lines of an epoch the resumed run trains again. Resume cuts the logs back to the sizes the saved
    state records, so the logs equal an uninterrupted run's, torn last line included."""
    import foco.train.loop as loop
    _run(tmp_path / "straight")
    real, calls = loop.save_training_state, []

    def killed_on_the_second_save(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise _Killed
        return real(*args, **kwargs)
    monkeypatch.setattr(loop, "save_training_state", killed_on_the_second_save)
    _run(tmp_path / "killed")  # `_run` takes the kill as it takes any other
    assert len(calls) == 2
    monkeypatch.setattr(loop, "save_training_state", real)
    killed = tmp_path / "killed"
    assert [(r["stage"], r["epoch"]) for r in _lines(killed / "train_log.jsonl")] == [(1, 1), (1, 2)]  # 2 unsaved
    if torn:
        with (killed / "train_steps.jsonl").open("a") as f:
            f.write('{"step": 6, "sta')  # killed mid-line
    resumed = _run(killed, resume=True)
    for a, b in zip(_run(tmp_path / "again").state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    for name in ("train_log.jsonl", "train_steps.jsonl"):
        assert _lines(killed / name) == _lines(tmp_path / "straight" / name), name


def test_each_phase_has_its_own_schedule_and_on_step_counts_globally(tmp_path):
    lrs, steps = {}, []
    model = _run(tmp_path / "a", log=lrs, plot_keys=("loss", "nothing"), on_step=lambda s, losses: steps.append(s))
    assert not model.training
    assert steps == list(range(2 * 3 + 3 * 3))
    assert lrs[1] == [1e-2 * f for f in _slow_schedule(6, 0.3)]
    assert lrs[2] == [5e-2 * f for f in _slow_schedule(9, 0.3)]
    assert (tmp_path / "a" / "loss_curve.png").stat().st_size > 1000


def test_max_steps_ends_each_phase_and_its_schedule(tmp_path):
    lrs = {}
    _run(tmp_path / "a", log=lrs, max_steps=4)
    assert lrs[1] == [1e-2 * f for f in _slow_schedule(4, 0.3)] and len(lrs[2]) == 4
    log = [json.loads(line) for line in (tmp_path / "a" / "train_log.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["epoch"], r["seen"]) for r in log] == [(1, 1, 3), (1, 2, 4), (2, 1, 7), (2, 2, 8)]


class _FakeTextTower:
    """A pseudo-token backbone in miniature: the text feature is a fixed projection of the inserted token."""

    spec, token_dim = "fake", 12

    def __init__(self):
        self.proj = torch.randn(12, 16, generator=torch.Generator().manual_seed(3))

    def encode_texts_with_tokens(self, texts, embeddings, placeholder="*"):
        return SimpleNamespace(global_=F.normalize(embeddings @ self.proj, dim=-1))  # (B, 16)


def test_pic2word_leaves_its_config_alone(tmp_path):
    from foco.methods.pic2word import Pic2WordConfig
    from foco.train.pic2word import Pic2WordTrainConfig, train_pic2word
    cfg = Pic2WordTrainConfig(epochs=2, batch_size=8, max_steps=5, model=Pic2WordConfig(hidden_dim=8))
    before = copy.deepcopy(cfg)
    v = F.normalize(torch.randn(30, 16, generator=torch.Generator().manual_seed(0)), dim=-1)  # (N, D)
    mapper = train_pic2word(v, _FakeTextTower(), tmp_path / "p2w", cfg, image_norm=torch.full((30,), 2.0))
    assert cfg == before and mapper.cfg.image_dim == 16 and mapper.cfg.token_dim == 12
    log = [json.loads(line) for line in (tmp_path / "p2w" / "train_log.jsonl").read_text().splitlines()]
    assert [r["steps"] for r in log] == [3, 5]


def _pair_table(n: int = 24, d: int = 16, k: int = 2, nt: int = 40):
    from foco.train.data import PairTable
    g = torch.Generator().manual_seed(0)
    text_mask = torch.rand(nt, 5, generator=g) < 0.8  # (Nt, L)
    text_mask[:, 0] = True
    local = torch.randint(0, nt, (n, k), generator=g)  # (N, K)
    local[::3, 1] = -1  # every third image has one pair only
    return PairTable(F.normalize(torch.randn(n, d, generator=g), dim=-1), torch.randn(n, 9, d, generator=g),
                     F.normalize(torch.randn(nt, d, generator=g), dim=-1), torch.randn(nt, 5, d, generator=g),
                     text_mask, local, torch.where(local >= 0, (local + 1) % nt, local))


def test_foco_leaves_its_config_alone_and_counts_steps_over_both_stages(tmp_path):
    from foco.model import FoCoConfig
    from foco.train.foco import FoCoTrainConfig, train_foco
    cfg = FoCoTrainConfig(stage1_epochs=1, stage2_epochs=2, batch_size=8, max_negatives=3,
                          model=FoCoConfig(heads=2, comp_depth=1, learn_bias=True))
    before = copy.deepcopy(cfg)
    steps = []
    model = train_foco(_pair_table(), tmp_path / "foco", cfg, on_step=lambda s, losses: steps.append((s, set(losses))))
    assert cfg == before and model.cfg.dim == 16
    assert [s for s, _ in steps] == list(range(3 * 3))
    assert steps[0][1] == {"aggr", "loss"} and steps[-1][1] == {"aggr", "comp", "loss"}
    meta = json.loads((tmp_path / "foco" / "foco.json").read_text())
    assert meta["config"]["dim"] == 16 and meta["train"]["stage2_epochs"] == 2


def test_a_non_finite_loss_stops_before_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    """A NaN at the third step of the second epoch: training stops naming the phase and step, the weights are those
    before that step, and train_state still holds the first epoch (resume continues from it)."""
    from foco.train.loop import NonFiniteError
    model, phases, gen = _toy()
    real = phases[0].step
    calls = []

    def step(idx):
        calls.append(1)
        losses = real(idx)
        if len(calls) == N // B + 3:  # epoch 2, step 3
            losses = {k: v * float("nan") for k, v in losses.items()}
        return losses
    phases[0].step = step
    before = {}

    def on_step(s, losses):
        before.update({k: v.detach().clone() for k, v in model.state_dict().items()})
    with pytest.raises(NonFiniteError, match=r"loss loss = nan, double = nan is not finite at training stage 1 epoch 2/2, global step"):
        run(model, phases, tmp_path / "a", LoopConfig(N, B, warmup_frac=0.3), np.random.default_rng(0), False, gen,
            on_step=on_step)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the bad step was not taken
    state = json.loads((tmp_path / "a" / "train_state" / "state.json").read_text())
    assert state["progress"]["epoch"] == 1 and all(torch.isfinite(p).all() for p in model.parameters())
    steps = (tmp_path / "a" / "train_steps.jsonl").read_text().splitlines()
    assert len(steps) == N // B  # only the saved epoch's steps


def test_non_finite_options_are_refused_by_name(capsys):
    from foco.cli import main
    for args in (["train", "--lr-stage1", "nan"], ["train", "--lr-comp", "inf"], ["train", "--lr-aggr", "0"],
                 ["train", "--preserve-weight=-1"], ["search", "--chord", "nan"],
                 ["backbone", "train", "--lr=-inf"]):
        with pytest.raises(SystemExit):
            main(args)
        err = capsys.readouterr().err
        flag = args[-1].split("=")[0] if "=" in args[-1] else args[-2]
        assert flag in err and ("finite" in err or "> 0" in err or "negative" in err), (args, err)


def test_the_curve_is_drawn_first_then_at_most_every_plot_every_s_and_after_the_last_epoch(tmp_path, monkeypatch):
    import foco.train.loop as loop
    drawn = []
    monkeypatch.setattr(loop, "plot_losses", lambda path, recs, *a, **k: drawn.append(len(recs)))
    monkeypatch.setattr(loop, "PLOT_EVERY_S", 1e9)
    _run(tmp_path / "a", plot_keys=("loss",))
    epochs = 2 + 3  # the toy's two phases
    assert drawn == [N // B, epochs * (N // B)]  # the first epoch's end, and the run's end with every step
    drawn.clear()
    monkeypatch.setattr(loop, "PLOT_EVERY_S", 0.0)
    _run(tmp_path / "b", plot_keys=("loss",))
    assert len(drawn) == epochs


def test_the_training_state_keeps_the_gpus_generator_too(tmp_path, monkeypatch):
    """Dropout on a GPU draws from the CUDA generator: a resumed run must continue it (here the CUDA calls are
    stood in for, so that the plumbing is checked on a machine without one)."""
    from foco.utils.checkpoint import load_training_state, save_training_state
    state = {"now": torch.arange(16, dtype=torch.uint8)}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda *a: state["now"].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda t, *a: state.update(now=t.clone()))
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    save_training_state(tmp_path / "s", model, opt, None, {"epoch": 1})
    state["now"] = torch.zeros(16, dtype=torch.uint8)  # the generator moved on in the killed run
    load_training_state(tmp_path / "s", model, opt, None)
    assert torch.equal(state["now"], torch.arange(16, dtype=torch.uint8))


def test_a_full_disk_is_a_clear_error_and_the_rerun_resumes(tmp_path, monkeypatch, tiny_world, train_features,
                                                              capsys):
    """Issue 42 item 5: `foco train` on a disk that fills while it appends its first epoch's log stops with an
    error naming the file (no traceback); the rerun is not refused as files foco did not write, and its logs hold
    each epoch once."""
    import errno
    import pathlib
    from foco.cli import main
    real_open = pathlib.Path.open

    def full(self, mode="r", *args, **kwargs):
        if self.name == "train_steps.jsonl" and "a" in mode:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(self, mode, *args, **kwargs)
    argv = ["train", "--features", str(train_features), "--world", str(tiny_world), "--out", str(tmp_path / "r"),
            "--stage1-epochs", "1", "--stage2-epochs", "1", "--batch-size", "128", "--max-negatives", "7"]
    monkeypatch.setattr(pathlib.Path, "open", full)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "train_steps.jsonl: the disk is full" in err and "Traceback" not in err, err
    assert (tmp_path / "r" / "train_log.jsonl").is_file()  # the epoch's first log was written, then the disk filled
    monkeypatch.setattr(pathlib.Path, "open", real_open)
    assert main(argv) == 0, capsys.readouterr().err
    log = _lines(tmp_path / "r" / "train_log.jsonl")
    assert [(r["stage"], r["epoch"]) for r in log] == [(1, 1), (2, 1)]
