"""Reliability (issue 13, finding 6): a backbone spec recorded in checkpoints and feature manifests is resolved, so
that a command run from another folder finds the same backbone (it used to record `world:runs/...` as typed)."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from foco.backbones import create_backbone
from foco.backbones.world import WorldCLIP, save_world_checkpoint

from test_backbone_world import SMALL


def test_a_relative_backbone_path_is_recorded_resolved(tmp_path, monkeypatch):
    torch.manual_seed(0)
    save_world_checkpoint(WorldCLIP(SMALL), tmp_path / "runs" / "bb")
    monkeypatch.chdir(tmp_path)
    spec = create_backbone("world:runs/bb").spec
    assert spec == f"world:{(tmp_path / 'runs' / 'bb').resolve()}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)
    assert create_backbone(spec).spec == spec  # the recorded spec works from another folder


def test_a_benchmark_cache_is_one_cache_whatever_the_path_spelling(tmp_path, monkeypatch):
    """Finding 6: the cache keyed on image paths as written, so `exp/cirr` and its absolute path conflicted, and
    the error pointed to --out instead of --cache."""
    from PIL import Image

    from foco.backbones.base import ImageFeatures
    from foco.features import ExtractConfig, extract_images

    class Tiny:
        embed_dim, num_patches, spec = 2, 1, "tiny:0"

        def encode_images(self, images):
            g = torch.nn.functional.normalize(torch.randn(len(images), 2), dim=-1)
            return ImageFeatures(g, g[:, None, :])

    (tmp_path / "exp" / "imgs").mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (4, 4)).save(tmp_path / "exp" / "imgs" / f"{i}.png")
    monkeypatch.chdir(tmp_path)
    rel = [(str(i), Path("exp/imgs") / f"{i}.png") for i in range(3)]
    absolute = [(i, (tmp_path / p).resolve()) for i, p in rel]
    cfg = ExtractConfig(out_flag="--cache")
    extract_images(Tiny(), rel, tmp_path / "cache", cfg)
    stats = extract_images(Tiny(), absolute, tmp_path / "cache", cfg)  # the same items: nothing to encode
    assert stats["encoded"] == 0
    other = [(i, p.with_name("x" + p.name)) for i, p in absolute]
    import pytest
    with pytest.raises(ValueError, match="use another --cache"):
        extract_images(Tiny(), other, tmp_path / "cache", cfg)
