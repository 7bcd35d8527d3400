"""`foco world generate --train-pairs/--pretrain-pairs` (issue 54's data-scale curve, issue 56's larger pretraining
split): a changed count leaves every other split as the preset draws it, scene for scene, so that training sets of
several sizes are compared on one val and one test."""
from __future__ import annotations

import json

import pytest

from foco.world.generate import config_record, plan_world, world_config
from foco.world.scene import Scene
from foco.world.vocab import MARK_PHRASES, MARKS


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


def _strip_marks(scene: dict) -> dict:
    return {**scene, "objects": [{k: v for k, v in o.items() if k != "mark"} for o in scene["objects"]]}


def test_pretraining_marks_touch_only_the_pretraining_split(tiny_plan):
    """Issue 56: marks on a share of the pretraining shapes, named by a share of the captions; the scenes are the
    preset's apart from their marks, the other words of every caption stay, and every other split is the same."""
    marked = plan_world(world_config("tiny", pretrain=900, pretrain_marks=0.5, mark_captions=0.5))
    assert all(marked[n] == r for n, r in tiny_plan.items() if n != "pairs/pretrain.jsonl")
    recs, before = marked["pairs/pretrain.jsonl"], tiny_plan["pairs/pretrain.jsonl"]
    assert [_strip_marks(r["scene"]) for r in recs[:600]] == [r["scene"] for r in before]
    shapes = [o for r in recs for o in r["scene"]["objects"] if o.get("stamp") is None]
    assert 0.45 < sum("mark" in o for o in shapes) / len(shapes) < 0.55
    assert set(o["mark"] for o in shapes if "mark" in o) == set(MARKS)
    named = [r for r in recs if any(f"with {MARK_PHRASES[o['mark']]}" in r["caption"]
                                    for o in r["scene"]["objects"] if "mark" in o)]
    with_marks = [r for r in recs if any("mark" in o for o in r["scene"]["objects"])]
    assert 0.3 < len(named) / len(with_marks) < 0.6  # about half the captions that mention a marked shape
    for r, b in zip(recs[:600], before):  # a detail caption names one marked shape alone; any other is the preset's
        if r in named:
            (pair,) = r["decomposition"]["pairs"]
            obj = r["scene"]["objects"][int(r["grounding"][0].split(":")[1])]
            assert pair["local"].endswith(f"{obj['kind']} with {MARK_PHRASES[obj['mark']]}")
            assert pair["local"] in r["caption"] and pair["context"] == "an empty scene"
        else:
            assert r["caption"] == b["caption"] and r["decomposition"] == b["decomposition"]


def test_marks_are_recorded_only_where_set_and_checked():
    assert "pretrain_marks" not in config_record(world_config("default"))
    rec = config_record(world_config("default", pretrain_marks=0.5, mark_captions=0.25))
    assert rec["pretrain_marks"] == 0.5 and rec["mark_captions"] == 0.25
    with pytest.raises(ValueError, match="--pretrain-marks"):
        world_config("tiny", mark_captions=0.5)
    with pytest.raises(ValueError, match="--mark-captions"):
        world_config("tiny", pretrain_marks=0.5, mark_captions=1.5)


def test_later_protocols_never_reuse_a_marked_pretraining_scene_unmarked(tmp_path):
    """A marked pretraining scene's unmarked layout counts as taken for the protocols drawn after the world (the
    ambiguous variant renders unmarked scenes; OACIR's are all marked), and a resumed generation with other mark
    settings is refused naming the setting."""
    from foco.world.ambiguous import world_layout_keys
    from foco.world.generate import _claim
    root = tmp_path / "w"
    (root / "pairs").mkdir(parents=True)
    recs = plan_world(world_config("tiny", pretrain_marks=1.0))["pairs/pretrain.jsonl"][:50]
    (root / "pairs" / "pretrain.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    keys = world_layout_keys(root)
    for r in recs:
        scene = Scene.from_dict(r["scene"])
        assert scene.layout_key() in keys and scene.without_marks().layout_key() in keys
    out = tmp_path / "claimed"
    out.mkdir()
    _claim(out, world_config("tiny", pretrain_marks=0.5))
    with pytest.raises(FileExistsError, match="pretrain_marks 0.5"):
        _claim(out, world_config("tiny"))
