"""The feature cache: shards with ids, exact round trip, resume after an interruption, refusal to mix caches."""
import json

import pytest
import torch
from safetensors.torch import load_file

from foco.backbones.base import ImageFeatures, TextFeatures
from foco.features import ExtractConfig, FeatureCache, extract_images
from foco.world.splits import extract_world_split, split_items


class HashBackbone:
    """A deterministic stand-in encoder: features derived from pixel sums and text lengths."""

    embed_dim, num_patches = 8, 4

    def __init__(self, name="hash", fail_after=None):
        self.spec, self.calls, self.fail_after = f"test:{name}", 0, fail_after

    def _tick(self):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt("simulated kill")

    def encode_images(self, images):
        self._tick()
        g = torch.stack([torch.tensor([float(sum(im.getpixel((i, i)))) for i in range(8)]) for im in images])
        return ImageFeatures(torch.nn.functional.normalize(g, dim=-1), g[:, None, :].repeat(1, 4, 1) / 100)

    def encode_texts(self, texts):
        self._tick()
        L = max(len(t.split()) for t in texts)
        g = torch.stack([torch.tensor([float(len(t) + k) for k in range(8)]) for t in texts])
        tokens = torch.zeros(len(texts), L, 8)
        mask = torch.zeros(len(texts), L, dtype=torch.bool)
        for i, t in enumerate(texts):
            n = len(t.split())
            tokens[i, :n] = g[i] / 100
            mask[i, :n] = True
        return TextFeatures(torch.nn.functional.normalize(g, dim=-1), tokens, mask)


def test_round_trip_matches_direct_encoding(tmp_path, tiny_world):
    bb = HashBackbone()
    cfg = ExtractConfig(shard_size=50, batch_size=16, dtype="float32")
    stats = extract_world_split(bb, tiny_world, "backbone_val", tmp_path / "c", cfg)
    images, texts = split_items(tiny_world, "backbone_val")
    assert stats["images"]["items"] == len(images) == 200
    assert len(list((tmp_path / "c" / "images").glob("*.safetensors"))) == 4
    cache = FeatureCache(tmp_path / "c")
    ids, f = cache.images()
    assert ids == [i for i, _ in images]
    from foco.utils.io import load_image
    direct = bb.encode_images([load_image(p) for _, p in images[:5]])
    assert torch.allclose(f.global_[:5], direct.global_) and torch.allclose(f.patches[:5], direct.patches)
    tids, tf = cache.texts()
    assert sorted(tids) == sorted(i for i, _ in texts) and len(set(tids)) == len(tids)
    lengths = [len(t) for t in tids]
    assert lengths == sorted(lengths)  # stored shortest first
    # captions, local and contextual captions are all there
    assert any(t.startswith("a ") and len(t.split()) <= 4 for t in tids)
    # a pairs split stores tokens for the contextual captions only (what training reads), globals for every text
    from foco.world.splits import context_texts
    contexts = context_texts(tiny_world, "backbone_val")
    context = next(t for _, t in texts if t in contexts)
    other = next(t for _, t in texts if t not in contexts)
    for text, has_tokens in ((context, True), (other, False)):
        row = tids.index(text)
        d = bb.encode_texts([text])
        n = int(d.mask.sum()) if has_tokens else 0
        assert torch.allclose(tf.global_[row], d.global_[0]) and tf.mask[row].sum() == n
        assert torch.allclose(tf.tokens[row, :n], d.tokens[0, :n])
    ragged = load_file(str(tmp_path / "c" / "texts" / "shard-00000.safetensors"))
    assert set(ragged) == {"global", "tokens", "offsets"} and ragged["tokens"].ndim == 2
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())["backbone"] == "test:hash"


def test_resume_after_interruption_encodes_only_missing_shards(tmp_path, tiny_world):
    images, _ = split_items(tiny_world, "backbone_val")
    cfg = ExtractConfig(shard_size=40, batch_size=20)
    with pytest.raises(KeyboardInterrupt):
        extract_images(HashBackbone(fail_after=5), images, tmp_path / "c", cfg)
    done = sorted(p.name for p in (tmp_path / "c" / "images").glob("*.json"))
    assert done == ["shard-00000.json", "shard-00001.json"]
    bb = HashBackbone()
    stats = extract_images(bb, images, tmp_path / "c", cfg)
    assert stats["encoded"] == 120 and bb.calls == 6
    ids, f = FeatureCache(tmp_path / "c").images()
    assert ids == [i for i, _ in images]
    ref = tmp_path / "ref"
    extract_images(HashBackbone(), images, ref, cfg)
    assert torch.equal(FeatureCache(ref).images()[1].global_, f.global_)
    # a finished cache is not re-encoded
    bb = HashBackbone()
    assert extract_images(bb, images, tmp_path / "c", cfg)["encoded"] == 0 and bb.calls == 0


def test_cache_refuses_other_backbone_or_items(tmp_path, tiny_world):
    images, _ = split_items(tiny_world, "backbone_val")
    cfg = ExtractConfig(shard_size=100)
    extract_images(HashBackbone(), images[:100], tmp_path / "c", cfg)
    with pytest.raises(ValueError, match="backbone"):
        extract_images(HashBackbone("other"), images[:100], tmp_path / "c", cfg)
    with pytest.raises(ValueError, match="another list of images"):
        extract_images(HashBackbone(), images[:90], tmp_path / "c", cfg)


def test_benchmark_split_items(tiny_world):
    images, texts = split_items(tiny_world, "val/single")
    assert len(images) > 40 and 0 < len(texts) <= 40


def test_cli_extract_with_world_backbone(tmp_path, tiny_world, capsys):
    from foco.backbones.world import WorldBackboneConfig, WorldCLIP, save_world_checkpoint
    from foco.cli import main
    save_world_checkpoint(WorldCLIP(WorldBackboneConfig(widths=(8, 16, 32), embed_dim=32, text_width=32,
                                                        text_layers=1, text_heads=2)), tmp_path / "bb")
    assert main(["features", "extract", "--backbone", f"world:{tmp_path / 'bb'}", "--world", str(tiny_world),
                 "--split", "val/multi", "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "images:" in out and "texts:" in out
    ids, f = FeatureCache(tmp_path / "c").images()
    assert f.patches.shape == (len(ids), 64, 32)


def test_a_context_stored_without_tokens_is_refused_not_trained_on(tmp_path, tiny_world):
    """A training split stores tokens only for the contexts of the decompositions it was extracted with; pairs
    whose context is another text (here the caption, stored as a global vector) must not train F_Comp on nothing."""
    from foco.decompose.schema import Decomposition, LocalContextPair
    from foco.train.data import build_pair_table
    from foco.world.manifest import load_pairs
    extract_world_split(HashBackbone(), tiny_world, "backbone_val", tmp_path / "c", ExtractConfig(shard_size=64))
    pairs = load_pairs(tiny_world, "backbone_val")
    oracle = {p.id: p.decomposition for p in pairs}
    assert len(build_pair_table(tmp_path / "c", oracle)) == len(pairs)
    other = {p.id: Decomposition(p.caption, [LocalContextPair(p.decomposition.pairs[0].local, p.caption)])
             for p in pairs}
    with pytest.raises(ValueError, match=r"contextual captions have no token features.*extract it again"):
        build_pair_table(tmp_path / "c", other)
