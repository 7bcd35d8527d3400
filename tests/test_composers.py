"""PACT and TSCIR: the tunable text tower (LoRA on a tiny random hf CLIP, the TextHead copy on the world), their
trainers on the tiny world (a few steps, better than chance), target images retrieved from the corpus against a
loop twin, the world's check of those targets, and the composer checkpoints."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from foco.backbones.tunable import TextTuneConfig, tunable_text
from foco.train.targets import best_images, match_targets, own_pair_threshold, parse_threshold

from test_backbone_hf import clip_dir  # noqa: F401  (fixture: a tiny random CLIP saved to disk)


def test_lora_with_zero_weights_is_the_untuned_text_tower(clip_dir):  # noqa: F811
    from foco.backbones.hf import HFBackbone
    bb = HFBackbone(clip_dir)
    text = tunable_text(bb, TextTuneConfig(lora_rank=4))
    assert text.cfg.kind == "lora"
    texts = ["a photo of * that is a dog", "a photo of *", "* and a cat"]
    emb = torch.randn(3, bb.token_dim, generator=torch.Generator().manual_seed(0))
    want = bb.encode_texts_with_tokens(texts, emb).global_
    with torch.no_grad():
        torch.testing.assert_close(text(texts, emb), want, atol=1e-5, rtol=0)  # peft starts B at zero
        trainable = {n for n, p in text.named_parameters() if p.requires_grad}
        assert trainable and all("lora_" in n for n in trainable)
        for n, p in text.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)
        assert (text(texts, emb) - want).abs().max() > 1e-3  # the adapters do act
        for n, p in text.named_parameters():
            if "lora_B" in n:
                p.zero_()
        torch.testing.assert_close(text(texts, emb), want, atol=1e-5, rtol=0)
    assert bb.model.text_model is not text.text  # the backbone's own tower is untouched
    with pytest.raises(ValueError, match="world"):
        tunable_text(bb, TextTuneConfig(kind="world-head"))


def test_best_images_match_a_loop_and_exclude_the_source():
    g = torch.Generator().manual_seed(0)
    text = F.normalize(torch.randn(7, 8, generator=g), dim=-1)
    images = F.normalize(torch.randn(20, 8, generator=g), dim=-1)
    exclude = torch.randint(0, 20, (7,), generator=g)
    images[exclude[0]] = text[0]  # the best image of text 0 is its own source: it must not be chosen
    rows, sims = best_images(text, images, exclude, chunk=3)
    for t in range(7):
        cands = [(float(text[t] @ images[n]), n) for n in range(20) if n != exclude[t]]
        best = max(cands)
        assert rows[t].item() == best[1] and sims[t].item() == pytest.approx(best[0], abs=1e-6)
    match = match_targets(text, images, exclude, threshold=float(sims.median()))
    assert match.kept.sum().item() == int((sims >= sims.median()).sum()) and (match.rows[~match.kept] == -1).all()
    auto = match_targets(text, images, exclude, "auto", source_caption=images[exclude])
    assert auto.threshold == pytest.approx(1.0, abs=1e-5)  # captions identical to their images: median cosine 1
    assert own_pair_threshold(text, text, 0.5) == pytest.approx(1.0, abs=1e-6)
    assert parse_threshold("auto") == "auto" and parse_threshold("0.25") == 0.25
    for bad in ("high", "1.5"):
        with pytest.raises(ValueError, match="--target-threshold"):
            parse_threshold(bad)


def test_the_world_tells_whether_a_retrieved_target_is_right():
    from foco.world.scene import Scene, WorldObject
    from foco.world.targets import check_targets, edited_scene, fits_caption
    src = Scene("beach", (WorldObject("circle", "red", "small", 0), WorldObject("star", "blue", "large", 1)))
    remove = {"kind": "remove", "provenance": {"phrase": "the small red circle"}, "target_caption": "a large blue star"}
    colour = {"kind": "attribute", "provenance": {"phrase": "a large blue star", "old": "blue", "new": "green"},
              "target_caption": "a small red circle and a large green star on a beach"}
    setting = {"kind": "replace", "provenance": {"phrase": "a beach", "new": "a forest"},
               "target_caption": "a small red circle and a large blue star in a forest"}
    gone = Scene("beach", (WorldObject("star", "blue", "large", 3),))
    green = Scene("beach", (WorldObject("circle", "red", "small", 2), WorldObject("star", "green", "large", 0)))
    forest = Scene("forest", src.objects)
    assert edited_scene(src, remove)[1] == {("star", "blue", "large"): 1}
    assert edited_scene(src, setting)[0] == "forest"
    report = check_targets([remove, colour, setting, remove], [src] * 4, [gone, green, forest, src])
    assert report["remove"] == {"triplets": 2, "retrieved": 2, "fits": 2, "parsed": 2, "right": 1}  # src keeps it
    assert report["attribute"]["right"] == 1 and report["replace"]["right"] == 1
    assert fits_caption(src, "a small red circle") and not fits_caption(src, "a small red circle in a forest")
    assert not fits_caption(gone, "two: a large blue star and a large blue star")


def _hits(queries: torch.Tensor, keys: torch.Tensor) -> float:
    return (torch.argmax(queries @ keys.t(), 1) == torch.arange(len(keys))).float().mean().item()


@pytest.mark.slow
def test_pact_trains_beats_chance_and_reloads(edit_table, train_features, tmp_path):  # noqa: F811
    from foco import create_backbone
    from foco.features import FeatureCache
    from foco.methods.composer import TextComposer
    from foco.train.pact import PACTTrainConfig, train_pact
    bb = create_backbone(FeatureCache(train_features).manifest["backbone"])
    before_head = {k: v.clone() for k, v in bb.model.text.state_dict().items()}
    cfg = PACTTrainConfig(identity_epochs=1, joint_epochs=2, batch_size=64, lr_warmup=1e-3, lr_mapper=1e-3,
                          lr_text=1e-3)
    composer = train_pact(edit_table, bb, tmp_path / "pact", cfg)
    log = [json.loads(line) for line in (tmp_path / "pact" / "train_log.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in log] == ["identity", "joint", "joint"]
    assert log[-1]["compose"] < log[1]["compose"]
    for k, v in bb.model.text.state_dict().items():  # the frozen backbone is untouched: only the copy trains
        assert torch.equal(v, before_head[k]), k
    idx = torch.arange(256)
    b = edit_table.batch(idx)
    with torch.no_grad():
        q = composer(b.reference.global_, None, b.texts)
        again = TextComposer.load(tmp_path / "pact", bb, expect="pact")(b.reference.global_, None, b.texts)
    torch.testing.assert_close(again, q)
    hits = _hits(q, b.target)
    assert hits > 4 / 256, hits  # an instruction on its source finds its own target caption among 256
    with pytest.raises(ValueError, match="not 'tscir'"):
        TextComposer.load(tmp_path / "pact", bb, expect="tscir")
    with pytest.raises(ValueError, match="nothing to train"):
        train_pact(edit_table, bb, tmp_path / "none", PACTTrainConfig(compose_weight=0, preserve_weight=0))


def _spread_table(D: int, P: int, n: int = 256):
    """An EditTable over n spread random images (a random tiny backbone maps real images to nearly one point):
    triplet t edits image t; its target caption's feature is image (t + 1) % n, its source caption's is image t."""
    from foco.feature_store import TokenView
    from foco.train.edit_data import EditTable
    g = torch.Generator().manual_seed(0)
    images = F.normalize(torch.randn(n, D, generator=g), dim=-1)
    texts = torch.cat([images, F.normalize(torch.randn(4, D, generator=g), dim=-1)])  # + 4 instruction rows
    words = ["left", "right", "up", "down"]
    return EditTable(images, torch.randn(n, P, D, generator=g), texts,
                     TokenView.padded(torch.zeros(n + 4, 1, D), torch.ones(n + 4, 1, dtype=torch.bool)), torch.arange(n), n + torch.arange(n) % 4,
                     (torch.arange(n) + 1) % n, torch.full((n, 1), -1), [f"move it {words[t % 4]}" for t in range(n)],
                     torch.arange(n), torch.full((n,), -1))


@pytest.mark.slow
def test_tscir_maps_then_composes_on_retrieved_targets(clip_dir, tmp_path):  # noqa: F811
    """On the tiny random hf CLIP (LoRA in stage 2): the targets are found by retrieval, stage 1 learns the mapping
    (the frozen text tower's "a photo of *" finds its own image far above chance), stage 2 lowers its loss."""
    from foco.backbones.hf import HFBackbone
    from foco.methods.pic2word import Pic2WordConfig
    from foco.train.tscir import TSCIRTrainConfig, train_tscir
    bb = HFBackbone(clip_dir)
    table = _spread_table(bb.embed_dim, bb.num_patches)
    cfg = TSCIRTrainConfig(stage1_epochs=40, stage2_epochs=3, batch_size=64, lr_stage1=3e-3, lr_stage2=1e-3,
                           weight_decay=0.0, threshold=0.99, max_triplets=192, model=Pic2WordConfig(hidden_dim=64))
    torch.manual_seed(0)
    composer, match = train_tscir(table, bb, tmp_path / "tscir", cfg)
    assert match.kept.all() and torch.equal(match.rows, table.target)  # the target caption is its image's
    meta = json.loads((tmp_path / "tscir" / "composer.json").read_text())
    assert meta["mapper"] == "vsi" and meta["text"]["kind"] == "lora" and meta["targets"]["trained_on"] == 192
    log = [json.loads(line) for line in (tmp_path / "tscir" / "train_log.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in log] == ["mapping"] * 40 + ["composing"] * 3
    assert log[39]["map"] < log[0]["map"] and log[42]["loss"] < log[40]["loss"]
    v, patches = table.image_global[:64], table.patches[:64]
    with torch.no_grad():
        t = bb.encode_texts_with_tokens(["a photo of *"] * 64, composer.mapper(v, patches)).global_
    assert _hits(t, v) > 10 / 64


@pytest.mark.slow  # over 5 s (issue 53: make test-fast within 2 minutes)
def test_the_methods_compose_from_their_checkpoints(edit_table, train_features, tmp_path):  # noqa: F811
    from foco import create_backbone
    from foco.features import FeatureCache
    from foco.methods import MethodOptions, QueryBatch, build_method
    from foco.train.pact import PACTTrainConfig, train_pact
    bb = create_backbone(FeatureCache(train_features).manifest["backbone"])
    train_pact(edit_table, bb, tmp_path / "p", PACTTrainConfig(identity_epochs=0, joint_epochs=1, max_steps=2))
    b = edit_table.batch(torch.arange(4))
    method = build_method("pact", opts=MethodOptions(pact=tmp_path / "p", backbone=bb))
    q = method.encode(QueryBatch(b.reference, b.instruction, b.texts)).query
    assert q.shape == (4, b.target.shape[1]) and torch.allclose(q.norm(dim=-1), torch.ones(4), atol=1e-5)
    with pytest.raises(ValueError, match="--tscir"):
        build_method("tscir", opts=MethodOptions(backbone=bb))
