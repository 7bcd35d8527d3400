"""Reliability (issue 13, finding 5): a truncated or garbage safetensors file, or a checkpoint of another width, is
an error that names the file and the fix, not a bare SafetensorError or "size mismatch" traceback."""
from __future__ import annotations

import json

import pytest
import torch

from foco.model import ComposedQueryEncoder, FoCoConfig


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(0)
    ComposedQueryEncoder(FoCoConfig(dim=16, heads=4)).save(tmp_path / "foco")
    return tmp_path / "foco"


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_damaged_checkpoint_names_its_file(checkpoint, damage):
    weights = checkpoint / "foco.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x00garbage" * 50)
    with pytest.raises(ValueError, match=r"foco.safetensors is not a readable safetensors file.*foco train"):
        ComposedQueryEncoder.load(checkpoint)


def test_a_checkpoint_of_another_width_names_its_file(checkpoint):
    meta = json.loads((checkpoint / "foco.json").read_text())
    meta["config"]["dim"] = 32  # the weights are 16 wide
    (checkpoint / "foco.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"foco.safetensors does not fit this model \(size mismatch"):
        ComposedQueryEncoder.load(checkpoint)


def test_a_damaged_feature_shard_names_its_file_and_the_fix(tmp_path):
    from foco.backbones.base import TextFeatures
    from foco.features import ExtractConfig, FeatureCache, extract_texts

    class Tiny:  # a two-dimensional text encoder: enough to write a real cache
        embed_dim, num_patches, spec = 2, 1, "tiny:0"

        def encode_texts(self, texts):
            g = torch.nn.functional.normalize(torch.randn(len(texts), 2), dim=-1)
            return TextFeatures(g, g[:, None, :], torch.ones(len(texts), 1, dtype=torch.bool))

    extract_texts(Tiny(), [(t, t) for t in ("a", "b", "c")], tmp_path / "cache", ExtractConfig(shard_size=2))
    shard = tmp_path / "cache" / "texts" / "shard-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:20])
    with pytest.raises(ValueError, match=r"shard-00001.safetensors: its bytes do not match the sha256.*rerun the "
                                         r"`foco features extract`"):
        FeatureCache(tmp_path / "cache").texts()
    record = tmp_path / "cache" / "texts" / "shard-00001.json"  # a cache from before shards recorded their hash
    record.write_text(json.dumps({"ids": json.loads(record.read_text())["ids"]}))
    with pytest.raises(ValueError, match=r"shard-00001.json records no sha256.*content_sha256"):
        FeatureCache(tmp_path / "cache").texts()  # ... which a cache that records its content hash cannot hold
    manifest = tmp_path / "cache" / "manifest.json"  # nor its manifest: one from before content hashes
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "texts": {
        k: v for k, v in json.loads(manifest.read_text())["texts"].items() if k != "content_sha256"}}))
    with pytest.raises(ValueError, match=r"shard-00001.safetensors is not a readable.*rerun the `foco features "
                                         r"extract`"):
        FeatureCache(tmp_path / "cache").texts()
