"""Reliability (issue 13, content hashes): feature shards, world images and backbone weights carry a sha256 that
extraction, `verify` and loading check, so damage or a swapped file is repaired or refused, never used."""
from __future__ import annotations

import json

import pytest
import torch

from foco.backbones.base import TextFeatures
from foco.features import ExtractConfig, FeatureCache, extract_texts, verify_cache


class Tiny:  # a deterministic two-dimensional text encoder: enough to write a real cache
    embed_dim, num_patches, spec = 2, 1, "tiny:0"

    def encode_texts(self, texts):
        g = torch.tensor([[float(len(t)), 1.0] for t in texts])
        g = torch.nn.functional.normalize(g, dim=-1)
        return TextFeatures(g, g[:, None, :], torch.ones(len(texts), 1, dtype=torch.bool))


def _cache(path):
    return extract_texts(Tiny(), [(t, t) for t in ("a", "bb", "ccc", "dddd", "eeeee")], path,
                         ExtractConfig(shard_size=2))


def test_a_damaged_shard_is_encoded_again_not_reported_cached(tmp_path):
    """Finding 5: a corrupt feature shard was reported "all cached", so a rerun never repaired it."""
    _cache(tmp_path / "c")
    before = FeatureCache(tmp_path / "c").texts()[1].global_.clone()
    shard = tmp_path / "c" / "texts" / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF  # one flipped byte inside the tensors: still a readable safetensors file
    shard.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"shard-00001.safetensors: its bytes do not match the sha256.*rerun"):
        FeatureCache(tmp_path / "c").texts()
    assert verify_cache(tmp_path / "c")["texts"]["bad"]
    stats = _cache(tmp_path / "c")
    assert stats["encoded"] == 2 and stats["repaired"] == 1
    assert torch.equal(FeatureCache(tmp_path / "c").texts()[1].global_, before)
    assert verify_cache(tmp_path / "c")["texts"]["bad"] == []


def test_features_verify_exits_nonzero_and_names_the_shard(tmp_path, capsys):
    from foco.cli import main
    _cache(tmp_path / "c")
    assert main(["features", "verify", "--cache", str(tmp_path / "c")]) == 0
    (tmp_path / "c" / "texts" / "shard-00002.safetensors").unlink()
    assert main(["features", "verify", "--cache", str(tmp_path / "c")]) == 1
    out = capsys.readouterr().out
    assert "shard-00002.safetensors: its tensors are missing" in out and "foco features extract" in out


def test_world_verify_catches_a_replaced_image(tiny_world, tmp_path):
    """Finding 2's other half: `foco world verify` passed a world whose images were not its own."""
    import shutil
    from foco.utils.io import ImageLoadError
    from foco.world.verify import verify_world
    world = tmp_path / "w"
    shutil.copytree(tiny_world, world)
    assert verify_world(world)["content_hashes"] == "checked"
    a, b = sorted((world / "images" / "train").glob("*.png"))[:2]
    shutil.copyfile(b, a)  # a valid PNG, but another scene
    with pytest.raises(ImageLoadError, match=rf"(?s)1 of .* changed.*{a.name}: content differs from the sha256.*new --out"):
        verify_world(world)


def test_a_world_backbone_whose_weights_changed_is_refused(tmp_path):
    from foco.backbones.world import WorldBackboneConfig, WorldCLIP, load_world_backbone, save_world_checkpoint
    torch.manual_seed(0)
    cfg = WorldBackboneConfig(widths=(4, 4, 8), embed_dim=8, text_width=8, text_layers=1, text_heads=2, pool_heads=2)
    save_world_checkpoint(WorldCLIP(cfg), tmp_path / "bb")
    other = WorldCLIP(cfg)
    torch.nn.init.zeros_(other.image.c_proj.weight)
    save_world_checkpoint(other, tmp_path / "other")
    (tmp_path / "bb" / "model.safetensors").write_bytes((tmp_path / "other" / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match=r"model.safetensors does not match the sha256 recorded in .*config.json"):
        load_world_backbone(tmp_path / "bb")


@pytest.mark.parametrize("name", ["pretrained", "vit"])
def test_the_shipped_backbone_is_checked_and_recorded_by_name(monkeypatch, tmp_path, name):
    import shutil
    from foco.backbones import SHIPPED_WORLD, canonical_spec
    from foco.backbones import world as W
    assert tuple(W.SHIPPED) == SHIPPED_WORLD and canonical_spec(f"world:{name}") == f"world:{name}"
    bb = W.load_world_backbone(name)
    assert bb.spec == f"world:{name}"
    meta = json.loads((W.pretrained_dir(name) / "config.json").read_text())
    assert meta["provenance"]["command"].startswith("foco backbone train") and meta["provenance"]["machine"]
    copy = tmp_path / "assets"
    shutil.copytree(W.pretrained_dir(name), copy)
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    monkeypatch.setattr(W, "pretrained_dir", lambda _name: copy)
    with pytest.raises(ValueError, match=r"does not match the sha256.*reinstall foco.*--train-backbone"):
        W.load_world_backbone(name)


def test_circo_val_and_test_never_share_an_export_folder(tiny_world, tmp_path):
    """Finding 3: CIRCO val and test exported into one --out overwrote the image-info file and mixed galleries;
    the second export is refused before it writes anything."""
    from foco.benchmarks.export import export_world
    from foco.utils.io import ManifestError
    out = tmp_path / "circo"
    export_world(tiny_world, "circo", "val", out)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    with pytest.raises(ManifestError, match=r"another split \(world_export.circo.val.json\).*own --out"):
        export_world(tiny_world, "circo", "test", out)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
