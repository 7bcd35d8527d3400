"""Issue 42 item 3: one number rule (`foco.utils.parse`). Each bounded option takes its largest documented value and
gives a finite result; one step beyond is refused, naming the flag. Integers are ASCII digits within their range
(a seed within [0, 2**32 - 1], counts within int64), never "²" or a 20-digit number that overflows downstream."""
from __future__ import annotations

import json
import math

import pytest
import torch

from foco.cli import build_parser, main
from foco.utils.parse import MAX_BOX_BETA, MAX_CHORD, MAX_SEED


def _refused(argv, capsys, *needles):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([str(a) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    for n in needles:
        assert n in err, err


@pytest.mark.parametrize("value", ["-1", str(MAX_SEED + 1), "12345678901234567890", "²", "٣", "1.5", "nan"])
def test_a_seed_outside_its_range_is_refused_naming_the_flag(value, capsys):
    for argv in (["train", "--features", "f", "--out", "o"], ["world", "generate", "--out", "o"],
                 ["pic2word", "train", "--features", "f", "--out", "o"], ["quickstart", "--out", "o"]):
        _refused([*argv, "--seed", value], capsys, "--seed", str(MAX_SEED))


@pytest.mark.parametrize("value", ["²", "٣", "99999999999999999999999", "1e3"])
def test_a_count_is_ascii_digits_within_int64(value, capsys):
    _refused(["train", "--features", "f", "--out", "o", "--batch-size", value], capsys, "--batch-size", "ASCII")


@pytest.mark.parametrize("flag,beyond", [("--box-beta", f"{MAX_BOX_BETA * 1.01}"), ("--box-beta", "-1e308"),
                                         ("--chord", f"{MAX_CHORD + 1}")])
def test_search_refuses_a_value_beyond_its_range(flag, beyond, capsys):
    _refused(["search", "--index", "i", "--text", "t", "--reference", "1", flag, beyond], capsys, flag)


def test_eval_refuses_a_chord_beyond_its_range(tiny_world, capsys):
    assert main(["eval", "--world", str(tiny_world), "--methods", "sum", "--chord", str(MAX_CHORD + 1)]) == 2
    assert "--chord" in capsys.readouterr().err


def test_the_largest_index_memory_is_taken_and_one_more_is_refused():
    from foco.search.vectors import MAX_BYTES, parse_bytes
    assert parse_bytes("1024TB") == MAX_BYTES
    for value in ("1025TB", "9" * 400):
        with pytest.raises(ValueError, match="--max-index-memory"):
            parse_bytes(value)


def test_search_at_the_largest_box_beta_and_chord_gives_finite_scores(four_image_index, tmp_path, capsys):
    from foco.model import ComposedQueryEncoder, FoCoConfig
    torch.manual_seed(0)
    ComposedQueryEncoder(FoCoConfig(dim=256)).save(tmp_path / "foco", {"backbone": "world:pretrained"})
    for beta in (MAX_BOX_BETA, -MAX_BOX_BETA):
        assert main(["search", "--index", str(four_image_index), "--checkpoint", str(tmp_path / "foco"),
                     "--text", "make it red", "--reference", "1", "--box", "0,0,40,40", "--box-beta", str(beta),
                     "--chord", str(MAX_CHORD), "-k", "3", "--json"]) == 0
        hits = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
        assert len(hits) == 3 and all(math.isfinite(h["score"]) for h in hits), hits


def test_eval_at_the_largest_chord_gives_finite_metrics(tiny_world, eval_features, tmp_path):
    out = tmp_path / "r.json"
    assert main(["eval", "--world", str(tiny_world), "--features", str(eval_features), "--protocols", "single",
                 "--methods", "sum,image", "--chord", str(MAX_CHORD), "--out", str(out)]) == 0
    metrics = json.loads(out.read_text())["methods"]
    assert all(math.isfinite(v) for m in metrics.values() for v in m.values()), metrics


def test_a_box_too_small_to_cover_a_patch_is_refused_not_ignored(four_image_index, tmp_path, capsys):
    """The probe's case: a box 1e-300 px wide used to be silently no box (its cover of every patch rounds to 0)."""
    from foco.model import ComposedQueryEncoder, FoCoConfig
    torch.manual_seed(0)
    ComposedQueryEncoder(FoCoConfig(dim=256)).save(tmp_path / "foco", {"backbone": "world:pretrained"})
    base = ["search", "--index", str(four_image_index), "--checkpoint", str(tmp_path / "foco"), "--text", "make it red",
            "--reference", "1", "-k", "2"]
    assert main([*base, "--box", "0,0,1e-300,1e-300"]) == 2
    assert "too small to cover any patch" in capsys.readouterr().err
    assert main([*base, "--box", "0,0,1,1"]) == 0  # one pixel still anchors its patch


TEXT_TYPES = {"setting_list"}  # options whose values are names, not numbers


def test_no_numeric_option_takes_a_value_that_overflows(capsys):
    """Issue 42 item 3: every option typed as a number has a documented finite range (`foco.utils.parse`), so no
    command takes 1e308, -1e308 or nan: a learning rate, a loss weight, a timeout, a seed, a count, a share alike."""
    import argparse
    from foco.cli import build_parser
    from foco.methods import declared_options
    taken = []

    def walk(p, name):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for n, sp in a.choices.items():
                    walk(sp, f"{name} {n}")
            elif a.option_strings and a.type not in (None, str) and getattr(a.type, "__name__", "") not in TEXT_TYPES:
                for v in ("1e308", "-1e308", "nan", "inf"):
                    try:
                        a.type(v)
                    except (argparse.ArgumentTypeError, ValueError):
                        continue
                    taken.append(f"{name} {a.option_strings[-1]} {v}")
    walk(build_parser(), "foco")
    for opt, _ in declared_options().values():
        if opt.parse is float or getattr(opt.parse, "__module__", "").startswith("foco"):
            for v in ("1e308", "nan"):
                try:
                    value = opt.parse(v)
                except (argparse.ArgumentTypeError, ValueError):
                    continue
                if not isinstance(value, str):
                    taken.append(f"{opt.flag} {v}")
    assert not taken, taken


def test_training_at_the_largest_learning_rates_keeps_the_weights_finite(tiny_world, train_features, tmp_path):
    from safetensors.torch import load_file
    from foco.utils.parse import MAX_LR
    lr = str(MAX_LR)
    assert main(["train", "--features", str(train_features), "--world", str(tiny_world), "--out", str(tmp_path / "o"),
                 "--stage1-epochs", "1", "--stage2-epochs", "1", "--batch-size", "64", "--lr-stage1", lr,
                 "--lr-aggr", lr, "--lr-comp", lr]) == 0
    assert all(torch.isfinite(t).all() for t in load_file(tmp_path / "o" / "foco.safetensors").values())
    for flag in ("--lr-stage1", "--lr-aggr", "--lr-comp"):
        with pytest.raises(SystemExit):
            main(["train", "--features", str(train_features), "--out", str(tmp_path / "x"), flag, str(MAX_LR * 1.5)])
