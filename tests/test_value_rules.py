"""Issue 55: every count has a documented bound, refused by the flag's name; each text value (a box, a query
template, a pseudo word's placeholder) goes through one parser, on the command line and the server alike."""
from __future__ import annotations

import argparse

import pytest
import torch

from foco.cli import build_parser, main
from foco.cli.bounds import BOUNDS, max_workers

HUGE = str(2 ** 62)


@pytest.mark.parametrize("argv,flag", [
    (["index", "build", "--images", "x", "--backbone", "world:vit", "--out", "o", "--workers", HUGE], "--workers"),
    (["index", "update", "x", "--workers", HUGE], "--workers"),
    (["features", "extract", "--backbone", "world:vit", "--world", "w", "--split", "train", "--out", "o",
      "--workers", str(max_workers() + 1)], "--workers"),
    (["serve", "--index", "x", "--workers", HUGE], "--workers"),
    (["adafocal", "train", "--features", "f", "--world", "w", "--out", "o", "--layers", "49"], "--layers"),
    (["adafocal", "train", "--features", "f", "--world", "w", "--out", "o", "--probes", HUGE], "--probes"),
    (["world", "oacir", "--world", "w", "--queries", "100001"], "--queries"),
    (["world", "ambiguous", "--world", "w", "--queries", HUGE], "--queries"),
    (["decompose", "--in", "x", "--out", "s.sqlite", "--min-pairs", HUGE], "--min-pairs"),
    (["train", "--features", "f", "--world", "w", "--out", "o", "--min-pairs", "65"], "--min-pairs"),
    (["features", "extract", "--backbone", "world:vit", "--world", "w", "--split", "train", "--out", "o",
      "--shard-size", HUGE], "--shard-size"),
    (["world", "export", "--world", "w", "--format", "webdataset", "--out", "o", "--shard-size", HUGE],
     "--shard-size"),
    (["train", "--features", "f", "--world", "w", "--out", "o", "--batch-size", HUGE], "--batch-size"),
    (["search", "--index", "x", "--text", "t", "--k", HUGE], "--k"),
])
def test_a_count_beyond_its_bound_is_refused_by_the_flags_name(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}" in err.replace("-k/", "") and "above the bound" in err, err


def test_every_bound_is_shown_in_help_and_the_bound_itself_is_accepted():
    p = build_parser()
    args = p.parse_args(["adafocal", "train", "--features", "f", "--world", "w", "--out", "o", "--layers", "48",
                         "--probes", "1024"])
    assert (args.layers, args.probes) == (48, 1024)
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    ada = next(a for a in sub.choices["adafocal"]._actions if isinstance(a, argparse._SubParsersAction))
    assert "(at most 48)" in ada.choices["train"].format_help()
    assert all(isinstance(v, tuple) and len(v) == 2 for v in BOUNDS.values())


@pytest.mark.parametrize("text", ["1_0,0,20,20", "nan,0,20,20", "0x1,0,20,20", "0,0,20", "0,0,20,20,1",
                                  "20,0,10,20", "-1,0,20,20", "inf,0,20,20", "٣,0,20,20", "", "1e400,0,20,20"])
def test_a_box_is_parsed_by_one_rule_on_the_command_line_and_the_server(text):
    from foco.serve.common import QueryError, parse_box as server_box
    from foco.utils.parse import parse_box
    with pytest.raises(ValueError):
        parse_box(text)
    if text:
        with pytest.raises(QueryError, match="box"):
            server_box(text)


def test_a_box_in_plain_decimals_is_read_exactly():
    from foco.serve.common import parse_box as server_box
    from foco.utils.parse import parse_box
    assert parse_box("0, 0.5,24,2.4e1") == (0.0, 0.5, 24.0, 24.0) == server_box("0, 0.5,24,2.4e1")


@pytest.mark.parametrize("value", ["1_0", "0x1", "nan", "inf", " 1e999", "١"])
def test_a_real_flag_reads_ascii_decimals_only(value, capsys):
    with pytest.raises(SystemExit):
        main(["search", "--index", "x", "--text", "t", "--chord", value])
    assert "argument --chord" in capsys.readouterr().err


@pytest.mark.parametrize("template", ["{", "{0}{1}", "{name}", "a * {!r}", "a * {:>3}", "{}", "a * {} {0}",
                                      "a photo of * that {}}"])
def test_a_query_template_that_format_rejects_is_refused_by_name(template):
    from foco.methods.pic2word import resolve_template
    with pytest.raises(ValueError, match="--pic2word-template"):
        resolve_template(template)


def test_a_users_own_star_is_never_the_image_token():
    from foco.backbones.pseudo import placeholder_slots
    ids = torch.tensor([[5, 9, 7, 9, 9, 3], [9, 7, 7, 9, 3, 3]])  # 9: the placeholder
    emb = torch.zeros(2, 4)
    texts = ["a * b * * c", "* b c * d d"]
    got = placeholder_slots(ids, 9, texts, "*", emb, keep=(1, 0))
    assert got.tolist() == [[False, True, False, False, False, False], [True, False, False, False, False, False]]
    got = placeholder_slots(ids, 9, texts, "*", emb, keep=(1, 1))
    assert got.sum(1).tolist() == [2, 2] and bool(got[0, 4]) and bool(got[1, 3])
    with pytest.raises(ValueError, match="fewer than the template's 3"):
        placeholder_slots(ids, 9, texts, "*", emb, keep=(2, 1))


def test_pic2word_reads_a_users_star_as_the_word_it_is(trainer_runs, monkeypatch):
    import foco.backbones.world as world
    from foco import create_backbone
    from foco.methods.pic2word import Pic2WordMethod
    folder = trainer_runs / "pic2word"
    spec = __import__("json").loads((folder / "pic2word.json").read_text())["backbone"]
    backbone = create_backbone(spec, device="cpu")
    seen = []
    slots = world.placeholder_slots

    def recorded(*args, **kwargs):
        seen.append(slots(*args, **kwargs))
        return seen[-1]
    monkeypatch.setattr(world, "placeholder_slots", recorded)
    method = Pic2WordMethod.load(folder, backbone)
    v = torch.randn(2, method.mapper.cfg.image_dim)
    starred = method.encode_raw(v, ["make it * red", "add a * and a *"], backbone).query
    assert [int(s.sum()) for s in seen[-1]] == [1, 1]  # only the template's placeholder
    plain = method.encode_raw(v, ["make it red", "add a and a"], backbone).query
    assert not torch.allclose(starred, plain)  # the user's * is read as a word, not dropped
