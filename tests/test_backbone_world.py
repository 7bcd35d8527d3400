"""The world backbone: registry loading, documented shapes, training smoke test with resume."""
import json
from dataclasses import replace

import pytest
import torch

from foco import create_backbone
from foco.train.world_backbone import BackboneTrainConfig, train_world_backbone
from foco.backbones.world import WorldBackboneConfig, WorldCLIP, save_world_checkpoint
from foco.utils.io import load_image
from foco.world import load_pairs

SMALL = WorldBackboneConfig(widths=(8, 16, 32), embed_dim=32, text_width=32, text_layers=1, text_heads=2)


def test_world_checkpoint_loads_through_registry(tmp_path, tiny_world):
    torch.manual_seed(0)
    save_world_checkpoint(WorldCLIP(SMALL), tmp_path)
    bb = create_backbone(f"world:{tmp_path}")
    assert bb.spec == f"world:{tmp_path}" and bb.embed_dim == 32 and bb.num_patches == 64
    pairs = load_pairs(tiny_world, "train")[:3]
    im = bb.encode_images([load_image(p.image) for p in pairs])
    assert im.global_.shape == (3, 32) and im.patches.shape == (3, 64, 32)
    assert torch.allclose(im.global_.norm(dim=-1), torch.ones(3), atol=1e-5)
    tx = bb.encode_texts([p.caption for p in pairs])
    L = tx.tokens.shape[1]
    assert tx.global_.shape == (3, 32) and tx.tokens.shape == (3, L, 32) and tx.mask.shape == (3, L)
    assert tx.mask.dtype == torch.bool and tx.mask[:, 0].all()
    assert torch.allclose(tx.global_.norm(dim=-1), torch.ones(3), atol=1e-5)
    # the global text feature is the projected [CLS] token, in the same space as the tokens
    assert torch.allclose(torch.nn.functional.normalize(tx.tokens[:, 0], dim=-1), tx.global_, atol=1e-5)
    # batching does not change a text's features
    one = bb.encode_texts([pairs[0].caption])
    assert torch.allclose(one.global_[0], tx.global_[0], atol=1e-5)


def test_bad_specs_are_refused(tmp_path):
    with pytest.raises(ValueError, match="KIND:ARG"):
        create_backbone("nothing")
    with pytest.raises(ValueError, match="unknown backbone kind"):
        create_backbone("timm:resnet")
    with pytest.raises(FileNotFoundError, match="no world backbone"):
        create_backbone(f"world:{tmp_path}")


@pytest.mark.slow
def test_train_entry_point_learns_and_resumes(tmp_path, tiny_world):
    cfg = BackboneTrainConfig(epochs=2, batch_size=64, model=SMALL, lr=3e-3)
    out = tmp_path / "bb"
    m = train_world_backbone(tiny_world, out, cfg)
    assert m["n"] == 200 and 0 <= m["caption->image R@1"] <= 100
    log = [json.loads(l) for l in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [1, 2]
    assert log[1]["loss"] < log[0]["loss"]
    first = create_backbone(f"world:{out}")
    # run a third epoch on top of the saved state: resume starts at epoch 3, not 1. More epochs is a changed
    # setting: refused unless allowed, and then recorded from where it took effect (issue 24)
    cfg3 = BackboneTrainConfig(epochs=3, batch_size=64, model=SMALL, lr=3e-3)
    with pytest.raises(ValueError, match="--allow-changed epochs"):
        train_world_backbone(tiny_world, out, cfg3)
    train_world_backbone(tiny_world, out, replace(cfg3, allow_changed=("epochs",)))
    meta = json.loads((out / "config.json").read_text())
    assert meta["train"]["epochs"] == 2 and meta["train_changes"] == [{"at": {"epoch": 3},
                                                                      "changed": {"epochs": [2, 3]}}]
    log = [json.loads(l) for l in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [1, 2, 3]
    assert not torch.equal(first.model.image.c_proj.weight, create_backbone(f"world:{out}").model.image.c_proj.weight)
