"""Issue 24's probe, class 1 (provenance every consumer checks) and class 2 (integrity of what data means).

Each case is a mistake a user can make with real files: features, checkpoints and indexes made from one backbone or
world and used with another, a resumed run with changed settings, an id list or a manifest edited by hand."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from foco.cli import main


def _fails(argv, capsys, *needles) -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    for n in needles:
        assert n in err, err
    return err


@pytest.fixture(scope="module")
def other_backbone(tmp_path_factory):
    from foco.backbones.world import WorldCLIP, save_world_checkpoint
    from test_train import SMALL
    path = tmp_path_factory.mktemp("other-bb") / "bb"
    torch.manual_seed(7)
    save_world_checkpoint(WorldCLIP(SMALL), path)
    return path


def _checkpoint(path: Path, backbone: str, dim: int = 32) -> Path:
    from foco.model import ComposedQueryEncoder, FoCoConfig
    ComposedQueryEncoder(FoCoConfig(dim=dim)).save(path)
    meta = json.loads((path / "foco.json").read_text())
    (path / "foco.json").write_text(json.dumps({**meta, "backbone": backbone}))
    return path


def _eval(world, feats, *extra):
    return ["eval", "--benchmark", "world", "--root", world, "--split", "test", "--features", feats,
            "--slerp-alpha", "0.5", *extra]


def test_features_of_one_backbone_are_not_reported_under_another(tiny_world, eval_features, other_backbone, capsys):
    _fails(_eval(tiny_world, eval_features, "--methods", "sum", "--backbone", f"world:{other_backbone}"), capsys,
           "backbones differ", str(other_backbone), "--backbone")


def test_a_checkpoint_trained_on_another_backbone_is_refused(tiny_world, eval_features, other_backbone, tmp_path,
                                                              capsys):
    ckpt = _checkpoint(tmp_path / "ck", f"world:{other_backbone}")
    _fails(_eval(tiny_world, eval_features, "--methods", "foco", "--checkpoint", ckpt), capsys,
           "--checkpoint", str(other_backbone), "backbones differ")


def test_a_checkpoint_of_the_features_backbone_is_used(tiny_world, eval_features, train_features, tmp_path, capsys):
    from foco.features import FeatureCache
    ckpt = _checkpoint(tmp_path / "ck", FeatureCache(train_features).manifest["backbone"])
    assert main([str(a) for a in _eval(tiny_world, eval_features, "--methods", "foco", "--checkpoint", ckpt,
                                       "--out", tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["backbone"] == FeatureCache(train_features).manifest["backbone"]


def _other_world(tiny_world: Path, out: Path) -> Path:
    """The tiny world's files under another world.json (another config): same ids, another world."""
    out.mkdir()
    for name in ("benchmarks", "pairs"):
        shutil.copytree(tiny_world / name, out / name)
    (out / "images").symlink_to(tiny_world / "images", target_is_directory=True)
    summary = json.loads((tiny_world / "world.json").read_text())
    summary["config"]["seed"] = summary["config"]["seed"] + 1
    (out / "world.json").write_text(json.dumps(summary))
    return out


def test_features_of_another_world_are_refused_by_eval(tiny_world, eval_features, tmp_path, capsys):
    other = _other_world(tiny_world, tmp_path / "w2")
    _fails(_eval(other, eval_features, "--methods", "sum"), capsys, "--root", "holds features of world")


def test_features_of_another_world_are_refused_by_train(tiny_world, train_features, tmp_path, capsys):
    other = _other_world(tiny_world, tmp_path / "w2")
    _fails(["train", "--features", train_features, "--world", other, "--out", tmp_path / "o"], capsys,
           "--world", "holds features of world")
    assert not (tmp_path / "o").exists()


def test_features_of_another_split_are_refused_by_train(tiny_world, train_features, tmp_path, capsys):
    _fails(["train", "--features", train_features, "--world", tiny_world, "--split", "pretrain",
            "--out", tmp_path / "o"], capsys, "--split")


def test_pic2word_refuses_a_backbone_other_than_the_features(train_features, other_backbone, tmp_path, capsys):
    _fails(["pic2word", "train", "--features", train_features, "--backbone", f"world:{other_backbone}",
            "--out", tmp_path / "p"], capsys, "backbones differ", "--backbone")


def test_a_cache_refuses_the_same_spec_with_other_weights(tiny_world, tmp_path):
    """A backbone folder whose weights were replaced keeps its spec; the cache's sha256 tells them apart."""
    from foco import create_backbone
    from foco.backbones.world import WorldCLIP, save_world_checkpoint
    from foco.features import extract_images
    from test_train import SMALL
    images = [(f"i{i}", p) for i, p in enumerate(sorted((tiny_world / "images").rglob("*.png"))[:3])]
    torch.manual_seed(1)
    save_world_checkpoint(WorldCLIP(SMALL), tmp_path / "bb")
    extract_images(create_backbone(f"world:{tmp_path / 'bb'}"), images, tmp_path / "c")
    torch.manual_seed(2)
    save_world_checkpoint(WorldCLIP(SMALL), tmp_path / "bb")  # the same folder, new weights
    with pytest.raises(ValueError, match="other weights"):
        extract_images(create_backbone(f"world:{tmp_path / 'bb'}"), images, tmp_path / "c")


def test_an_index_refuses_a_checkpoint_of_another_backbone(four_image_index, other_backbone, tmp_path):
    from foco.search.engine import SearchEngine
    ckpt = _checkpoint(tmp_path / "ck", f"world:{other_backbone}")
    with pytest.raises(ValueError, match="backbones differ.*--checkpoint"):
        SearchEngine.open(four_image_index, checkpoint=ckpt)


# --- resuming with changed settings -------------------------------------------------------------------------------

def _phases(model, lrs=(0.1, 0.05)):
    return [__import__("foco.train.loop", fromlist=["Phase"]).Phase(
        2, lambda lr=lr: torch.optim.SGD(model.parameters(), lr=lr),
        lambda idx: {"loss": model(torch.ones(len(idx), 2)).pow(2).mean()}, tag={"stage": s + 1},
        settings=(f"lr{s + 1}",) if s else ()) for s, lr in enumerate(lrs)]


def _run(out, settings, allow=(), stop_after=None, lrs=(0.1, 0.05)):
    from foco.train.loop import LoopConfig, run
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    phases = _phases(model, lrs)
    if stop_after is not None:
        phases[1].epochs = 0 if stop_after == 1 else phases[1].epochs
    cfg = LoopConfig(8, 4, settings=settings, allow_changed=frozenset(allow))
    return run(model, phases, out, cfg, np.random.default_rng(0), resume=True)


def test_resume_refuses_a_changed_setting_and_names_the_flag(tmp_path):
    _run(tmp_path, {"lr1": 0.1, "lr2": 0.05, "seed": 0}, stop_after=1)
    with pytest.raises(ValueError, match=r"lr1=0.1 \(now 0.2\).*--allow-changed lr1"):
        _run(tmp_path, {"lr1": 0.2, "lr2": 0.05, "seed": 0}, lrs=(0.2, 0.05))


def test_resume_refuses_a_changed_seed_even_when_nothing_is_left(tmp_path):
    _run(tmp_path, {"lr1": 0.1, "lr2": 0.05, "seed": 0})
    with pytest.raises(ValueError, match="seed=0"):
        _run(tmp_path, {"lr1": 0.1, "lr2": 0.05, "seed": 3})


def test_allow_changed_records_the_change_from_where_it_takes_effect(tmp_path):
    _run(tmp_path, {"lr1": 0.1, "lr2": 0.05, "seed": 0}, stop_after=1)
    history = _run(tmp_path, {"lr1": 0.1, "lr2": 0.05, "seed": 5}, allow=("seed",))
    assert history["start"]["seed"] == 0  # the past keeps its settings
    assert history["changes"] == [{"at": {"stage": 2, "epoch": 1}, "changed": {"seed": [0, 5]}}]


def test_a_phase_not_begun_may_change_its_own_settings_recorded_where_it_begins(tmp_path):
    _run(tmp_path, {"lr1": 0.1, "lr2": 0.05}, stop_after=1)
    history = _run(tmp_path, {"lr1": 0.1, "lr2": 0.01}, lrs=(0.1, 0.01))
    assert history["changes"] == [{"at": {"stage": 2, "epoch": 1}, "changed": {"lr2": [0.05, 0.01]}}]


def test_allow_changed_refuses_a_name_that_is_no_setting(tmp_path):
    _run(tmp_path, {"lr1": 0.1}, stop_after=1)
    with pytest.raises(ValueError, match="no setting of this run"):
        _run(tmp_path, {"lr1": 0.1}, allow=("learning_rate",))


def test_foco_train_resume_keeps_the_recorded_settings(tiny_world, train_features, tmp_path, capsys):
    base = ["train", "--features", train_features, "--world", tiny_world, "--out", tmp_path / "o",
            "--stage1-epochs", "1", "--stage2-epochs", "1", "--batch-size", "64", "--device", "cpu"]
    assert main([str(a) for a in base]) == 0
    meta = json.loads((tmp_path / "o" / "foco.json").read_text())
    assert meta["provenance"]["features"]["fingerprint"] and meta["provenance"]["backbone"]["weights_sha256"]
    _fails(base + ["--resume", "--max-negatives", "3"], capsys, "max_negatives", "--allow-changed max_negatives")
    assert main([str(a) for a in base + ["--resume", "--max-negatives", "3", "--allow-changed", "max-negatives"]]) == 0
    after = json.loads((tmp_path / "o" / "foco.json").read_text())
    assert after["train"] == meta["train"]  # the past keeps its settings; the change applied to no step:
    assert [c["changed"] for c in after["train_changes"]] == [{"max_negatives": [None, 3]}]
    assert after["train_changes"][0]["at"]["trained"] == "no step after it"


# --- integrity of what the data means -----------------------------------------------------------------------------

def _copy_cache(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_an_id_changed_in_a_shard_record_fails_verify_and_every_reader(train_features, tmp_path, capsys):
    from foco.features import FeatureCache
    cache = _copy_cache(train_features, tmp_path / "c")
    meta = cache / "images" / "shard-00000.json"
    rec = json.loads(meta.read_text())
    rec["ids"][0], rec["ids"][1] = rec["ids"][1], rec["ids"][0]  # two labels swapped: the tensors are untouched
    meta.write_text(json.dumps(rec))
    assert main(["features", "verify", "--cache", str(cache)]) == 1
    assert "id list" in capsys.readouterr().out
    with pytest.raises(ValueError, match="id list"):
        FeatureCache(cache).rows("images")


def test_an_id_list_edited_with_its_own_hash_is_caught_by_the_manifest(train_features, tmp_path, capsys):
    from foco.features import FeatureCache, ids_sha256
    cache = _copy_cache(train_features, tmp_path / "c")
    meta = cache / "images" / "shard-00000.json"
    rec = json.loads(meta.read_text())
    rec["ids"][0] = "someone-else"
    rec["ids_sha256"] = ids_sha256(rec["ids"])
    meta.write_text(json.dumps(rec))
    assert main(["features", "verify", "--cache", str(cache)]) == 1
    assert "ids differ" in capsys.readouterr().out
    with pytest.raises(ValueError, match="ids differ"):
        FeatureCache(cache).ids("images")


def test_a_manifest_count_edited_by_hand_is_caught(train_features, tmp_path, capsys):
    cache = _copy_cache(train_features, tmp_path / "c")
    manifest = json.loads((cache / "manifest.json").read_text())
    manifest["texts"]["count"] -= 1
    (cache / "manifest.json").write_text(json.dumps(manifest))
    assert main(["features", "verify", "--cache", str(cache)]) == 1
    assert "counts" in capsys.readouterr().out


def _world_copy(tiny_world: Path, out: Path) -> Path:
    shutil.copytree(tiny_world, out, ignore=shutil.ignore_patterns("images"))
    (out / "images").symlink_to(tiny_world / "images", target_is_directory=True)
    return out


def test_world_verify_catches_a_deleted_pair_line(tiny_world, tmp_path, capsys):
    world = _world_copy(tiny_world, tmp_path / "w")
    lines = (world / "pairs" / "train.jsonl").read_text().splitlines(keepends=True)
    (world / "pairs" / "train.jsonl").write_text("".join(lines[1:]))
    assert main(["world", "verify", str(world)]) == 2
    assert "train.jsonl" in capsys.readouterr().err


def test_world_verify_catches_an_edited_query(tiny_world, tmp_path, capsys):
    world = _world_copy(tiny_world, tmp_path / "w")
    path = world / "benchmarks" / "test" / "single" / "queries.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    rec = json.loads(lines[0])
    rec["modification"] = rec["modification"] + " and make it huge"
    path.write_text(json.dumps(rec) + "\n" + "".join(lines[1:]))
    assert main(["world", "verify", str(world)]) == 2
    assert "edited since generation" in capsys.readouterr().err


def test_world_verify_passes_an_intact_world(tiny_world, capsys):
    assert main(["world", "verify", str(tiny_world)]) == 0


def test_a_change_to_a_phase_that_then_trains_nothing_is_still_recorded(tmp_path):
    from foco.train.loop import LoopConfig, Phase, run
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)

    def phases(e2):
        return [Phase(2, lambda: torch.optim.SGD(model.parameters(), lr=0.1),
                      lambda idx: {"loss": model(torch.ones(len(idx), 2)).pow(2).mean()}, tag={"stage": s},
                      settings=("stage2_epochs",) if s == 2 else ()) for s in (1, 2)][:1] + \
            [Phase(e2, lambda: torch.optim.SGD(model.parameters(), lr=0.1),
                   lambda idx: {"loss": model(torch.ones(len(idx), 2)).pow(2).mean()}, tag={"stage": 2},
                   settings=("stage2_epochs",))]
    first = phases(0)
    run(model, first, tmp_path, LoopConfig(8, 4, settings={"stage2_epochs": 3}), np.random.default_rng(0), True)
    history = run(model, phases(0), tmp_path, LoopConfig(8, 4, settings={"stage2_epochs": 0}),
                  np.random.default_rng(0), True)
    assert history["changes"] and history["changes"][0]["changed"] == {"stage2_epochs": [3, 0]}
