"""The feature cache: shards with ids, exact round trip, resume after an interruption, refusal to mix caches."""
import json

import pytest
import torch
from safetensors.torch import load_file

from foco.backbones.base import ImageFeatures, TextFeatures
from foco.features import ExtractConfig, FeatureCache, extract_images
from foco.methods.base import QueryMethod
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


class _ReadsEverything(QueryMethod):
    """A query method of this test's own: it reads the patches and every token, so a wrong row shows."""

    reads_anchor = False

    def encode(self, batch):
        from foco.model.encoder import ComposedQuery
        m = batch.modification
        q = batch.reference.patches.mean(1) + (m.tokens * m.mask[..., None]).sum(1) + batch.reference.global_
        return ComposedQuery(torch.nn.functional.normalize(q, dim=-1), None, None)


def test_evaluation_and_edit_tables_read_features_a_batch_at_a_time(tmp_path, tiny_world, small_edit_table,
                                                                    train_features, monkeypatch):
    """A benchmark part holds the gallery's globals only; composing reads each batch's reference patches and text
    tokens from the shards (never more rows than the batch) and gives the queries the whole cache gives. The edit
    table reads its batches' patches and instruction tokens the same way."""
    from foco.benchmarks.cache import PartFeatures
    from foco.benchmarks.world import read_world, world_features
    from foco.eval.compose import compose
    from foco.feature_store import RowView, Rows, StoredTexts, TokenView
    extract_world_split(HashBackbone(), tiny_world, "val/single", tmp_path / "c",
                        ExtractConfig(shard_size=32, batch_size=16, dtype="float16"))
    bench = read_world(tiny_world, "val", ("single",))[0]
    lazy = world_features(bench, tmp_path / "c")
    assert isinstance(lazy.references.patches, RowView) and len(lazy.references.patches) == len(bench.gallery)
    ids, im = FeatureCache(tmp_path / "c").images()
    tids, tf = FeatureCache(tmp_path / "c").texts()
    rows = torch.tensor([tids.index(t) for t in bench.texts()])
    eager = PartFeatures(ids, im.global_, ids, im, bench.texts(),
                         StoredTexts(tf.global_[rows], TokenView.padded(tf.tokens[rows], tf.mask[rows])))
    asked: dict[str, list[int]] = {"patches": [], "tokens": []}
    real_rows, real_tokens = Rows.rows, Rows.tokens
    monkeypatch.setattr(Rows, "rows", lambda self, name, idx: (asked.setdefault(name, []).append(len(idx)),
                                                               real_rows(self, name, idx))[1])
    monkeypatch.setattr(Rows, "tokens", lambda self, idx: (asked["tokens"].append(len(idx)),
                                                           real_tokens(self, idx))[1])
    batch = 7
    got = compose(_ReadsEverything(), bench, lazy, batch_size=batch).query
    assert max(asked["patches"]) <= batch and sum(asked["patches"]) == len(bench.queries)
    assert max(asked["tokens"]) <= batch and sum(asked["tokens"]) == len(bench.queries)
    monkeypatch.setattr(Rows, "rows", real_rows)
    monkeypatch.setattr(Rows, "tokens", real_tokens)
    want = compose(_ReadsEverything(), bench, eager, batch_size=len(bench.queries)).query
    assert torch.allclose(got, want, atol=1e-6)
    # the edit table: globals in memory, a batch's patches and instruction tokens read when it is drawn
    assert isinstance(small_edit_table.patches, RowView) and not isinstance(small_edit_table.text_tokens,
                                                                           torch.Tensor)
    _, whole = FeatureCache(train_features).images(dtype=None)
    idx = torch.tensor([5, 0, 3, 3])
    b = small_edit_table.batch(idx)
    assert torch.equal(b.reference.patches, whole.patches[small_edit_table.source[idx]].float())
    assert b.instruction.mask.shape[1] == int(b.instruction.mask.sum(1).max())  # padded to this batch's longest
