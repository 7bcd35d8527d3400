"""Reliability (issue 13, finding 6): a backbone spec recorded in checkpoints and feature manifests is resolved, so
that a command run from another folder finds the same backbone (it used to record `world:runs/...` as typed)."""
from __future__ import annotations

import os

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
