"""`foco world generate --train-pairs/--pretrain-pairs` (issue 54's data-scale curve, issue 56's larger pretraining
split): a changed count leaves every other split as the preset draws it, scene for scene, so that training sets of
several sizes are compared on one val and one test."""
from __future__ import annotations

import json

import pytest

from foco.world.generate import config_record, plan_world, world_config
from foco.world.scene import Scene


@pytest.fixture(scope="module")
def tiny_plan():
    return plan_world(world_config("tiny"))


def test_more_training_pairs_keep_every_other_split(tiny_plan):
    big = plan_world(world_config("tiny", train=1500, pretrain=900))
    for name, recs in tiny_plan.items():
        if name in ("pairs/train.jsonl", "pairs/pretrain.jsonl"):
            assert big[name][:len(recs)] == recs  # the preset's pairs first, then the extra ones
            continue
        assert big[name] == recs, name
    assert len(big["pairs/train.jsonl"]) == 1500 and len(big["pairs/pretrain.jsonl"]) == 900
    ids = [r["id"] for r in big["pairs/train.jsonl"]]
    assert len(set(ids)) == 1500 and ids[600] == "train-000600"
    # no extra scene repeats a layout anywhere, and extra pretraining pairs share no caption-level scene with
    # backbone_val (the rule the preset's pretrain split keeps)
    every = [Scene.from_dict(r["scene"]).layout_key() for name, recs in big.items()
             if not name.endswith("queries.jsonl") for r in recs]
    assert len(every) == len(set(every))
    held = {Scene.from_dict(r["scene"]).semantic_key() for r in big["pairs/backbone_val.jsonl"]}
    assert not held & {Scene.from_dict(r["scene"]).semantic_key() for r in big["pairs/pretrain.jsonl"]}


def test_fewer_training_pairs_keep_the_first_and_every_other_split(tiny_plan):
    small = plan_world(world_config("tiny", train=200))
    assert small["pairs/train.jsonl"] == tiny_plan["pairs/train.jsonl"][:200]
    assert all(small[n] == r for n, r in tiny_plan.items() if n != "pairs/train.jsonl")


def test_the_record_of_a_preset_is_unchanged_and_a_changed_count_is_recorded():
    rec = config_record(world_config("default"))
    assert "base_counts" not in rec and rec["train"] == 10000
    changed = config_record(world_config("default", train=30000))
    assert changed["train"] == 30000 and changed["base_counts"] == [10000, 10000]
    json.dumps(changed)
    with pytest.raises(ValueError, match="--train-pairs"):
        world_config("tiny", train=0)


def test_the_cli_bounds_the_counts(tmp_path, capsys):
    from foco.cli import main
    with pytest.raises(SystemExit):
        main(["world", "generate", "--out", str(tmp_path / "w"), "--train-pairs", "2000000"])
    assert "--train-pairs" in capsys.readouterr().err
