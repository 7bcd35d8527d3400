"""FoCo training: a killed run resumed with --resume ends with the same weights as an uninterrupted run."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from foco.backbones.world import WorldBackboneConfig

SMALL = WorldBackboneConfig(widths=(8, 16, 32), embed_dim=32, text_width=32, text_layers=1, text_heads=2)


def _cmd(world, feats, out, *extra):
    return [sys.executable, "-m", "foco.cli", "train", "--world", str(world), "--features", str(feats),
            "--out", str(out), "--stage1-epochs", "2", "--stage2-epochs", "6", "--batch-size", "64",
            "--lr-stage1", "1e-3", "--lr-aggr", "5e-4", "--lr-comp", "5e-4", "--max-negatives", "40", *extra]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_kill_and_resume_matches_uninterrupted_run(tiny_world, train_features, tmp_path):
    # the uninterrupted run and the one to be killed run side by side, one thread each (OMP_NUM_THREADS=1)
    full = tmp_path / "full"
    uninterrupted = subprocess.Popen(_cmd(tiny_world, train_features, full), env=_env(),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(_cmd(tiny_world, train_features, killed), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = killed / "train_state" / "state.json"
    deadline = time.time() + 120
    while time.time() < deadline:
        progress = json.loads(state.read_text())["progress"] if state.is_file() else {}
        if (progress.get("stage"), progress.get("epoch")) == (2, 1):
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _, err = uninterrupted.communicate(timeout=600)
    assert uninterrupted.returncode == 0, err[-2000:]
    assert not (killed / "foco.safetensors").exists()
    done = json.loads(state.read_text())["progress"]
    assert done["stage"] == 2 and done["epoch"] < 6

    # the same command continues the run in --out (the resume rule: no flag needed)
    resumed = subprocess.run(_cmd(tiny_world, train_features, killed), env=_env(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming FoCo training at stage 2" in resumed.stderr

    a, b = load_file(str(full / "foco.safetensors")), load_file(str(killed / "foco.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    log = [json.loads(l) for l in (full / "train_log.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["epoch"]) for r in log] == [(1, 1), (1, 2)] + [(2, e) for e in range(1, 7)]
    assert "comp" in log[-1] and log[-1]["comp"] < log[2]["comp"]  # stage 2 trains F_Comp
    assert (full / "loss_curve.png").stat().st_size > 1000
    cfg = json.loads((full / "foco.json").read_text())
    assert cfg["backbone"].startswith("world:") and cfg["config"]["dim"] == 32


def test_stage2_updates_both_modules(tiny_world, train_features, tmp_path):
    from foco.train.data import build_pair_table
    from foco.model import ComposedQueryEncoder, FoCoConfig
    from foco.train.foco import FoCoTrainConfig, train_foco
    from foco.world import load_pairs
    table = build_pair_table(train_features, {p.id: p.decomposition for p in load_pairs(tiny_world, "train")})
    torch.manual_seed(0)
    init = ComposedQueryEncoder(FoCoConfig(dim=32))
    stage1 = train_foco(table, tmp_path / "s1", FoCoTrainConfig(stage1_epochs=1, stage2_epochs=0, batch_size=64))
    assert torch.equal(stage1.comp.out.weight, init.comp.out.weight)  # stage 1: F_Comp untouched
    assert not torch.equal(stage1.aggr.q_proj.weight, init.aggr.q_proj.weight)
    both = train_foco(table, tmp_path / "s2", FoCoTrainConfig(stage1_epochs=1, stage2_epochs=1, batch_size=64))
    assert not torch.equal(both.comp.out.weight, init.comp.out.weight)
    assert not torch.equal(both.aggr.q_proj.weight, stage1.aggr.q_proj.weight)


def test_max_and_min_pairs_select_pairs_and_images(tiny_world, train_features, tmp_path, capsys):
    """--max-pairs K keeps each image's first K pairs; --min-pairs M leaves out (and counts) the images with fewer
    than M; the slow twin counts each image's pairs from the decompositions themselves."""
    from foco.train.data import build_pair_table
    from foco.train.foco import FoCoTrainConfig, _with_pairs
    from foco.world import load_pairs
    decs = {p.id: p.decomposition for p in load_pairs(tiny_world, "train")}
    table = build_pair_table(train_features, decs)
    per_image = {i: min(len(decs[i].pairs), 5) for i in table.ids}  # the slow twin: pairs per image
    assert max(per_image.values()) >= 3 > min(per_image.values())  # the tiny world has both kinds
    k2 = _with_pairs(table, FoCoTrainConfig(max_pairs=2))
    assert k2.local_idx.shape[1] == 2 and len(k2) == len(table)
    assert torch.equal(k2.local_idx, table.local_idx[:, :2])  # each image's first pairs
    m3 = _with_pairs(table, FoCoTrainConfig(max_pairs=3, min_pairs=3))
    want = [i for i in table.ids if per_image[i] >= 3]
    assert m3.ids == want and bool((m3.local_idx >= 0).all())  # every kept image has exactly 3
    assert f"training on {len(want)} of {len(table.ids)} images" in capsys.readouterr().out
    with pytest.raises(ValueError, match="min_pairs must be between 1 and max_pairs"):
        train_foco_cfg = FoCoTrainConfig(max_pairs=2, min_pairs=3)
        from foco.train.foco import train_foco
        train_foco(table, tmp_path / "bad", train_foco_cfg)
    with pytest.raises(ValueError, match="no training image has that many"):
        _with_pairs(table, FoCoTrainConfig(max_pairs=9, min_pairs=9))


def test_cli_records_max_and_min_pairs(tiny_world, train_features, tmp_path):
    from foco.cli import main
    out = tmp_path / "k"
    assert main(["train", "--world", str(tiny_world), "--features", str(train_features), "--out", str(out),
                 "--stage1-epochs", "1", "--stage2-epochs", "1", "--batch-size", "64", "--max-pairs", "2",
                 "--min-pairs", "2"]) == 0
    train = json.loads((out / "foco.json").read_text())["train"]
    assert (train["max_pairs"], train["min_pairs"]) == (2, 2)
