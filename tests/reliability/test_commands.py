"""Reliability (issue 13, own cases): bad input to every command group ends in one line that names the file,
field or flag and the fix, with exit status 2 (argparse's own refusals), never a traceback or a silent default."""
from __future__ import annotations

import json

import pytest

from foco.cli import main


def _fails(argv, capsys, *needles):
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    for n in needles:
        assert n in err, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("flag,value", [("--shard-size", "0"), ("--batch-size", "-1")])
def test_features_extract_refuses_bad_counts(flag, value, tiny_world, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["features", "extract", "--backbone", "world:pretrained", "--world", str(tiny_world), "--split", "train",
              "--out", str(tmp_path / "f"), flag, value])
    assert e.value.code == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("argv", [["backbone", "train", "--world", "w", "--out", "o", "--threads", "0"],
                                  ["decompose", "--in", "c.txt", "--out", "s.sqlite", "--max-pairs", "0"],
                                  ["decompose", "--in", "c.txt", "--out", "s.sqlite", "--decomposer", "llm",
                                   "--concurrency", "0"],
                                  ["edits", "generate", "--decompositions", "d", "--out", "e", "--per-caption", "-2"]])
def test_every_count_flag_refuses_zero_or_negative(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert "positive" in capsys.readouterr().err


def test_an_unknown_backbone_kind_lists_the_known_ones(tiny_world, tmp_path, capsys):
    _fails(["features", "extract", "--backbone", "clip:ViT-B-32", "--world", tiny_world, "--split", "train",
            "--out", tmp_path / "f"], capsys, "unknown backbone kind 'clip'", "hf", "world")


def test_a_missing_world_backbone_says_how_to_make_one(tiny_world, tmp_path, capsys):
    _fails(["features", "extract", "--backbone", f"world:{tmp_path / 'nothing'}", "--world", tiny_world,
            "--split", "train", "--out", tmp_path / "f"], capsys, "no world backbone at", "foco backbone train")


def test_an_unknown_split_is_named(tiny_world, tmp_path, capsys):
    _fails(["features", "extract", "--backbone", "world:pretrained", "--world", tiny_world, "--split", "trian",
            "--out", tmp_path / "f"], capsys, "trian")


def test_a_broken_manifest_line_is_named_by_file_and_line(tiny_world, tmp_path, capsys):
    import shutil
    world = tmp_path / "w"
    shutil.copytree(tiny_world, world)
    pairs = world / "pairs" / "train.jsonl"
    lines = pairs.read_text().splitlines()
    lines[6] = lines[6][:40]
    pairs.write_text("\n".join(lines) + "\n")
    _fails(["features", "extract", "--backbone", "world:pretrained", "--world", world, "--split", "train",
            "--out", tmp_path / "f"], capsys, f"{pairs}:7: not valid JSON")


def test_a_manifest_field_of_the_wrong_type_is_named(tiny_world, tmp_path, capsys):
    import shutil
    world = tmp_path / "w"
    shutil.copytree(tiny_world, world)
    pairs = world / "pairs" / "train.jsonl"
    lines = pairs.read_text().splitlines()
    rec = json.loads(lines[2])
    rec["decomposition"] = "a red square"
    lines[2] = json.dumps(rec)
    pairs.write_text("\n".join(lines) + "\n")
    _fails(["features", "extract", "--backbone", "world:pretrained", "--world", world, "--split", "train",
            "--out", tmp_path / "f"], capsys, f"{pairs}:3: bad decomposition")


def test_eval_with_a_folder_that_holds_no_checkpoint(tiny_world, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    _fails(["eval", "--benchmark", "world", "--root", tiny_world, "--split", "test", "--backbone", "world:pretrained",
            "--checkpoint", tmp_path / "empty", "--methods", "foco"], capsys, str(tmp_path / "empty"))


def test_a_damaged_training_state_names_itself_on_resume(tmp_path):
    import torch
    from foco.train.loop import LoopConfig, Phase, run
    import numpy as np

    def build():
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        opt = lambda: torch.optim.SGD(model.parameters(), lr=0.1)  # noqa: E731
        step = lambda idx: {"loss": model(torch.ones(len(idx), 2)).pow(2).mean()}  # noqa: E731
        return model, [Phase(2, opt, step)]

    model, phases = build()
    run(model, phases, tmp_path / "run", LoopConfig(8, 4, name="t"), np.random.default_rng(0))
    state = tmp_path / "run" / "train_state"
    tensors = next(p for p in state.iterdir() if p.suffix == ".safetensors")
    tensors.write_bytes(tensors.read_bytes()[:30])
    model, phases = build()
    with pytest.raises(ValueError, match=rf"{tensors.name}.*remove {state}"):
        run(model, phases, tmp_path / "run", LoopConfig(8, 4, name="t"), np.random.default_rng(0), resume=True)


def test_an_edit_store_is_not_taken_for_a_decomposition_store(tiny_world, tmp_path, capsys):
    from foco.edits.store import EditStore
    with EditStore(tmp_path / "edits.sqlite"):
        pass
    _fails(["train", "--features", tmp_path / "f", "--world", tiny_world, "--decompositions",
            tmp_path / "edits.sqlite", "--out", tmp_path / "o"], capsys, "edits.sqlite")
