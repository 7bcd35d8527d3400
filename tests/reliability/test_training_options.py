"""Reliability (issue 13, finding 7): training options are validated. `--batch-size 0` used to raise
ZeroDivisionError and `--batch-size -4` saved an untrained checkpoint with exit 0; epochs must not be negative, and a
run with nothing to train is refused."""
from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from foco.cli import build_parser
from foco.train.loop import LoopConfig, Phase, run


@pytest.mark.parametrize("argv,message", [
    (["train", "--features", "f", "--world", "w", "--out", "o", "--batch-size", "0"], "positive count"),
    (["pic2word", "train", "--features", "f", "--out", "o", "--batch-size", "-4"], "positive count"),
    (["train", "--features", "f", "--world", "w", "--out", "o", "--stage2-epochs", "-1"], "negative"),
    (["pact", "train", "--features", "f", "--edits", "e", "--out", "o", "--joint-epochs", "-2"], "negative"),
])
def test_the_command_line_refuses_bad_counts(argv, message, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert message in capsys.readouterr().err


def _phase(epochs: int) -> Phase:
    model = torch.nn.Linear(2, 1)
    return Phase(epochs, lambda: torch.optim.SGD(model.parameters(), lr=0.1),
                 lambda idx: {"loss": model(torch.randn(len(idx), 2)).pow(2).mean()})


@pytest.mark.parametrize("batch,epochs,message", [(0, 1, "--batch-size"), (-4, 1, "--batch-size"),
                                                  (8, -1, "epochs"), (8, 0, "nothing would be trained")])
def test_the_loop_refuses_them_too_and_writes_nothing(batch, epochs, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        run(torch.nn.Linear(2, 1), [_phase(epochs)], tmp_path / "out", LoopConfig(32, batch),
            np.random.default_rng(0))
    assert not (tmp_path / "out").exists()


def test_resume_with_no_run_to_continue_is_refused(tmp_path, capsys):
    """Finding 7: `--resume` with no state silently started a fresh run."""
    from foco.cli import main
    code = main(["train", "--features", str(tmp_path / "f"), "--world", str(tmp_path / "w"),
                 "--out", str(tmp_path / "typo"), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and "holds no training run" in err and "drop --resume" in err
    assert not (tmp_path / "typo").exists()


def test_resume_refuses_another_batch_size_or_other_data(tmp_path):
    """Finding 7: `--resume` with another batch size or other features continued, and rewrote the provenance."""
    out = tmp_path / "run"
    run(torch.nn.Linear(2, 1), [_phase(2)], out, LoopConfig(32, 8, identity={"backbone": "world:/a"}),
        np.random.default_rng(0))
    for cfg, what in [(LoopConfig(32, 16, identity={"backbone": "world:/a"}), "batch_size 8"),
                      (LoopConfig(48, 8, identity={"backbone": "world:/a"}), "examples"),
                      (LoopConfig(32, 8, identity={"backbone": "world:/b"}), "backbone 'world:/a'")]:
        with pytest.raises(ValueError, match=rf"holds a run trained with .*{what}.*--restart.*choose another --out"):
            run(torch.nn.Linear(2, 1), [_phase(3)], out, cfg, np.random.default_rng(0), resume=True)
    # the same settings continue (one more epoch than before)
    run(torch.nn.Linear(2, 1), [_phase(3)], out, LoopConfig(32, 8, identity={"backbone": "world:/a"}),
        np.random.default_rng(0), resume=True)
    assert len((out / "train_log.jsonl").read_text().splitlines()) == 3


TRAINERS = (["train"], ["pact", "train"], ["tscir", "train"], ["pic2word", "train"], ["lincir", "train"],
            ["backbone", "train"])


def test_every_training_command_has_the_one_resume_rule():
    from foco.cli import build_parser
    parser = build_parser()
    for argv in TRAINERS:
        sub = parser
        for word in argv:
            sub = next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices[word]
        flags = {f for a in sub._actions for f in a.option_strings}
        assert {"--restart", "--resume", "--no-resume", "--allow-changed"} <= flags, argv


@pytest.mark.slow  # over 5 s (issue 53: make test-fast within 2 minutes)
def test_a_run_is_continued_restarted_on_request_and_old_flags_still_work(train_features, tmp_path, capsys):
    from foco.cli import main
    out = tmp_path / "p2w"
    base = ["pic2word", "train", "--features", str(train_features), "--out", str(out), "--epochs", "1",
            "--batch-size", "64"]
    assert main(base) == 0
    log = out / "train_log.jsonl"
    assert len(log.read_text().splitlines()) == 1
    first = (out / "pic2word.safetensors").read_bytes()
    assert main(base) == 0  # the same command: the finished run is continued, nothing retrained
    assert len(log.read_text().splitlines()) == 1 and (out / "pic2word.safetensors").read_bytes() == first
    capsys.readouterr()
    assert main(base + ["--lr", "1e-3"]) == 2  # a changed setting is refused, naming both ways on
    err = capsys.readouterr().err
    assert "--allow-changed" in err and "--restart" in err
    assert main(base + ["--lr", "1e-3", "--restart"]) == 0  # started over: one epoch logged, new weights
    assert "removed" in capsys.readouterr().err
    assert len(log.read_text().splitlines()) == 1 and (out / "pic2word.safetensors").read_bytes() != first
    assert main(base + ["--lr", "1e-3", "--resume"]) == 0  # deprecated, still works, and says so
    assert "--resume is deprecated" in capsys.readouterr().err
    assert main(base + ["--lr", "1e-3", "--resume", "--restart"]) == 2
    assert "contradict" in capsys.readouterr().err
    assert main(base + ["--no-resume"]) == 0  # deprecated alias of --restart
    err = capsys.readouterr().err
    assert "--no-resume is deprecated" in err and "removed" in err
    assert (out / "pic2word.safetensors").read_bytes() == first  # the first settings again, from the start
