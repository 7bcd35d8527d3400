"""The field side by side: pseudo-token text encoding, Pic2Word, slerp, Chord scoring, box anchoring and the
ambiguous world benchmark. Small: one mini world, a random small world backbone, tiny random CLIP/SigLIP."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from foco.backbones.world import WorldBackbone, WorldBackboneConfig, WorldCLIP
from foco.model.box import attention_mass, box_attention_bias, box_cover, box_patch_mask, patch_grid
from foco.benchmarks.world import load_world_part
from foco.eval.chord import chord_scores, chord_scores_candidates, chord_search
from foco.eval.compose import compose, reference_rows
from foco.eval.rank import Chord, score_queries
from foco.eval.select import choose_alpha, choose_lambda
from foco.index import ExactIndex
from foco.methods import build_method
from foco.methods.foco import FoCoMethod
from foco.methods.pic2word import Pic2WordConfig, Pic2WordMapper, Pic2WordMethod
from foco.methods.slerp import SlerpMethod, slerp
from foco.train.pic2word import Pic2WordTrainConfig, train_pic2word
from foco.model import ComposedQueryEncoder, FoCoConfig
from foco.world.generate import generate_world, world_config
from foco.world.splits import extract_world_split
from foco.features import ExtractConfig, FeatureCache

from test_backbone_hf import clip_dir, siglip_dir  # noqa: F401  (fixtures: tiny random checkpoints)

SMALL = WorldBackboneConfig(widths=(8, 16, 32), embed_dim=32, text_width=32, text_layers=1, text_heads=2)
MINI = {"pretrain": 8, "train": 192, "backbone_val": 8, "val_single": 16, "val_multi": 8, "test_single": 8,
        "test_multi": 4}


@pytest.fixture(scope="module")
def mini_world(tmp_path_factory):
    out = tmp_path_factory.mktemp("field") / "world"
    generate_world(out, world_config("tiny", **MINI))
    return out


@pytest.fixture(scope="module")
def world_bb():
    torch.manual_seed(0)
    return WorldBackbone(WorldCLIP(SMALL), "random")


@pytest.fixture(scope="module")
def val_features(mini_world, world_bb, tmp_path_factory):
    cache = tmp_path_factory.mktemp("field") / "val-single"
    extract_world_split(world_bb, mini_world, "val/single", cache, ExtractConfig(dtype="float32"))
    return load_world_part(mini_world, "val", "single", cache)  # (bench, feats)


# -- (1) pseudo tokens ----------------------------------------------------------------------------------------------

def _check_pseudo_equals_word(bb, words):
    templates = ["a photo of * here", "* on a road , at night", "*"]
    texts = [t.replace("*", w) for t, w in zip(templates, words)]
    emb = torch.stack([bb.token_embedding(w) for w in words])  # (3, E)
    assert emb.shape == (3, bb.token_dim)
    plain, pseudo = bb.encode_texts(texts), bb.encode_texts_with_tokens(templates, emb)
    torch.testing.assert_close(pseudo.global_, plain.global_, atol=1e-5, rtol=0)
    torch.testing.assert_close(pseudo.tokens, plain.tokens, atol=1e-5, rtol=0)
    assert torch.equal(pseudo.mask, plain.mask)
    # gradients reach the pseudo token through the frozen tower
    emb = emb.clone().requires_grad_(True)
    bb.encode_texts_with_tokens(templates, emb).global_.sum().backward()
    assert emb.grad is not None and emb.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="hold no"):
        bb.encode_texts_with_tokens(["no placeholder here"], emb[:1].detach())


def test_pseudo_token_hf_clip(clip_dir):  # noqa: F811
    from foco.backbones.hf import HFBackbone
    _check_pseudo_equals_word(HFBackbone(clip_dir), ["cat", "dog", "cat"])


def test_pseudo_token_hf_siglip(siglip_dir):  # noqa: F811
    from foco.backbones.hf import HFBackbone
    _check_pseudo_equals_word(HFBackbone(siglip_dir), ["cat", "dog", "red"])


def test_pseudo_token_world(world_bb):
    _check_pseudo_equals_word(world_bb, ["circle", "star", "beach"])
    with pytest.raises(ValueError, match="not one"):
        world_bb.token_embedding("a red circle")


# -- (2) Pic2Word ---------------------------------------------------------------------------------------------------

def _prompt_recall(mapper, bb, v):
    """R@1 of image -> "a photo of *" (* = phi(image)) among the batch's prompts."""
    with torch.no_grad():
        t = bb.encode_texts_with_tokens(["a photo of *"] * len(v), mapper.eval()(v)).global_  # (B, D)
    return (torch.argmax(v @ t.t(), 1) == torch.arange(len(v))).float().mean().item()


def test_pic2word_learns_the_prompt_retrieval(clip_dir, tmp_path):  # noqa: F811
    """The published objective on image features alone: after 40 steps, "a photo of *" with * = phi(v) retrieves
    its image far above chance (1/64). The features are spread random vectors: a random world backbone maps all
    world images to nearly one point (mean cosine 0.997), where no mapper can tell them apart."""
    from foco.backbones.hf import HFBackbone
    bb = HFBackbone(clip_dir)
    v = F.normalize(torch.randn(256, bb.embed_dim, generator=torch.Generator().manual_seed(0)), dim=-1)
    cfg = Pic2WordTrainConfig(epochs=40, batch_size=64, lr=3e-3, weight_decay=0.0, max_steps=40,
                              model=Pic2WordConfig(hidden_dim=64, mapper_input="normalized"))  # no raw vectors here
    torch.manual_seed(0)
    before = _prompt_recall(Pic2WordMapper(Pic2WordConfig(image_dim=bb.embed_dim, token_dim=bb.token_dim,
                                                          hidden_dim=64)), bb, v[:64])
    mapper = train_pic2word(v, bb, tmp_path / "p2w", cfg)
    after = _prompt_recall(mapper, bb, v[:64])
    assert after > max(before, 10 / 64), (before, after)


def test_pic2word_on_world_features_saves_loads_and_composes(mini_world, world_bb, val_features, tmp_path):
    from foco.features import extract_images
    from foco.world.manifest import load_pairs
    pairs = load_pairs(mini_world, "train")
    extract_images(world_bb, [(p.id, p.image) for p in pairs], tmp_path / "train", ExtractConfig(dtype="float32"))
    _, images = FeatureCache(tmp_path / "train").images()
    cfg = Pic2WordTrainConfig(epochs=2, batch_size=64, max_steps=4, model=Pic2WordConfig(hidden_dim=64))
    assert images.norm is not None and images.norm.shape == (len(images.global_),)  # the cache keeps the norms
    mapper = train_pic2word(images.global_, world_bb, tmp_path / "p2w", cfg, image_norm=images.norm)
    log = [json.loads(line) for line in (tmp_path / "p2w" / "train_log.jsonl").read_text().splitlines()]
    assert [r["steps"] for r in log] == [3, 4] and all(np.isfinite(r["loss"]) for r in log)
    with pytest.raises(FileExistsError):
        train_pic2word(images.global_, world_bb, tmp_path / "p2w", cfg)
    meta = json.loads((tmp_path / "p2w" / "pic2word.json").read_text())
    assert meta["model"] == "pic2word" and meta["config"]["token_dim"] == 384 and meta["backbone"] == world_bb.spec

    method = Pic2WordMethod.load(tmp_path / "p2w", world_bb)
    assert method.needs_text_tower and method.prompts(["make it blue"]) == ["a photo of * that make it blue"]
    bench, feats = val_features
    queries = compose(method, bench, feats).query  # (Q, D): the one composition path, raw texts in the batch
    assert queries.shape == (len(bench.queries), 32)
    torch.testing.assert_close(queries.norm(dim=-1), torch.ones(len(queries)))
    again = compose(Pic2WordMethod(mapper, world_bb), bench, feats, batch_size=5).query
    torch.testing.assert_close(queries, again, atol=1e-5, rtol=0)
    rows = reference_rows(bench, feats)
    direct = method.encode_raw(feats.references.global_[rows] * feats.references.norm[rows, None],  # raw input
                               [q.texts[0] for q in bench.queries], world_bb).query  # all queries in one call
    torch.testing.assert_close(queries, direct, atol=1e-5, rtol=0)
    assert set(score_queries(queries, bench, feats.gallery_ids, feats.gallery)) >= {"R@1", "Rs@1"}
    with pytest.raises(ValueError, match="needs --backbone"):  # the text tower is given when the method is built
        build_method("pic2word", pic2word=tmp_path / "p2w")
    with pytest.raises(ValueError, match="template"):
        Pic2WordMethod(mapper, query_template="a photo of *, {}")


# -- (3) slerp ------------------------------------------------------------------------------------------------------

def _angle(x, unit):
    return torch.acos((F.normalize(x, dim=-1) * unit).sum(-1).clamp(-1, 1))


def test_slerp_endpoints_norm_and_alpha_choice(val_features):
    g = torch.Generator().manual_seed(0)
    v, t = torch.randn(6, 16, generator=g), torch.randn(6, 16, generator=g)
    torch.testing.assert_close(slerp(v, t, 0.0), F.normalize(v, dim=-1))
    torch.testing.assert_close(slerp(v, t, 1.0), F.normalize(t, dim=-1))
    for a in (0.1, 0.5, 0.9):
        q = slerp(v, t, a)
        torch.testing.assert_close(q.norm(dim=-1), torch.ones(6))
        to_v, to_t = _angle(v, q), _angle(t, q)  # q lies on the arc, alpha of the way from v to t
        torch.testing.assert_close(to_v / (to_v + to_t), torch.full((6,), a), atol=1e-4, rtol=0)
    assert torch.isfinite(slerp(v, v, 0.3)).all()  # parallel: no division by sin(0)
    bench, feats = val_features
    alpha, table = choose_alpha(bench, feats, grid=(0.0, 0.5, 1.0))
    assert alpha in table and table[alpha] == max(table.values())
    queries = compose(SlerpMethod(0.0), bench, feats).query
    assert table[0.0] == score_queries(queries, bench, feats.gallery_ids, feats.gallery)["R@1"]


# -- (4) Chord ------------------------------------------------------------------------------------------------------

def _naive_chord(q, c, r, lam, eps=1e-6):
    q, c, r = q.double(), c.double(), r.double()
    d_c, d_q = c - r, q - r
    direction = 0.0
    if d_c.norm() > eps and d_q.norm() > eps:
        direction = float(d_c @ d_q / (d_c.norm() * d_q.norm()))
    return float(q @ c) + lam * direction


def _random_problem(Q=6, N=40, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    gallery = F.normalize(torch.randn(N, D, generator=g), dim=-1)
    ref_index = torch.randint(0, N, (Q,), generator=g)
    queries = F.normalize(torch.randn(Q, D, generator=g), dim=-1)
    queries[0] = gallery[ref_index[0]]  # a query equal to its reference: no direction
    return queries, gallery, ref_index


@pytest.mark.parametrize("lam", [0.0, 0.34, 1.0])
def test_chord_scores_equal_the_naive_loop(lam):
    queries, gallery, ref_index = _random_problem()
    refs = gallery[ref_index]  # the reference is in the gallery: c = r gives no direction
    naive = torch.tensor([[_naive_chord(queries[i], gallery[j], refs[i], lam) for j in range(len(gallery))]
                          for i in range(len(queries))])
    torch.testing.assert_close(chord_scores(queries, gallery, refs, lam), naive.float(), atol=1e-5, rtol=0)
    cand = torch.randint(0, len(gallery), (len(queries), 7))
    torch.testing.assert_close(chord_scores_candidates(queries, gallery[cand], refs, lam),
                               naive.gather(1, cand).float(), atol=1e-5, rtol=0)
    # exact search = sorting the naive scores, with the reference removed
    naive[torch.arange(len(queries)), ref_index] = float("-inf")
    _, ids = chord_search(queries, gallery, refs, lam, k=10, exclude=ref_index, chunk=4)
    assert torch.equal(ids, torch.sort(naive, dim=1, descending=True, stable=True).indices[:, :10])
    # a shortlist as large as the gallery is exact; a smaller one rescores only the cosine top items
    _, ids_all = chord_search(queries, gallery, refs, lam, k=10, shortlist=len(gallery) - 1, exclude=ref_index)
    assert torch.equal(ids_all, ids)
    index = ExactIndex(8)
    index.add(gallery)
    _, top = index.search(queries, 15, exclude=ref_index)
    _, ids15 = chord_search(queries, gallery, refs, lam, k=5, shortlist=15, exclude=ref_index)
    for i in range(len(queries)):
        cand_scores = naive[i, top[i]]
        assert ids15[i].tolist() == top[i][torch.sort(cand_scores, descending=True, stable=True).indices[:5]].tolist()
    if lam == 0:
        assert torch.equal(ids, index.search(queries, 10, exclude=ref_index)[1])


def test_chord_benchmark_scoring_and_lambda_choice(val_features):
    bench, feats = val_features
    queries = compose(SlerpMethod(0.5), bench, feats).query
    refs = feats.references.global_[reference_rows(bench, feats)].float()  # (Q, D)

    def metrics(chord):
        return score_queries(queries, bench, feats.gallery_ids, feats.gallery, chord)

    assert metrics(Chord(0.0, refs)) == metrics(None)
    exact = metrics(Chord(0.3, refs))
    assert metrics(Chord(0.3, refs, shortlist=len(feats.gallery_ids))) == exact
    assert exact != metrics(None)  # the direction term changes rankings on this benchmark
    lam, table = choose_lambda(queries, bench, feats, grid=(0.0, 0.2, 0.4), shortlist=50)
    assert lam in (0.0, 0.2, 0.4) and table[lam] == max(table.values())


# -- (5) box anchoring and the ambiguous benchmark ------------------------------------------------------------------

def test_box_geometry():
    assert patch_grid(64) == 8
    with pytest.raises(ValueError):
        patch_grid(10)
    boxes = torch.tensor([[0.0, 0.0, 32.0, 32.0], [30.0, 30.0, 33.0, 33.0], [float("nan")] * 4])
    cover = box_cover(boxes, 64, 8).view(3, 8, 8)
    assert torch.allclose(cover[0, :4, :4], torch.ones(4, 4)) and cover[0].sum() == 16
    mask = box_patch_mask(boxes, 64, 8)
    assert mask[0].sum() == 16
    assert mask[1].sum() == 1  # a box smaller than a patch still gets its best-covered one
    assert not mask[2].any()
    bias = box_attention_bias(boxes, 2.0, (64, 64), 8)
    assert set(bias.unique().tolist()) == {0.0, 2.0} and bias[2].abs().sum() == 0
    attn = torch.full((3, 64), 1 / 64)
    torch.testing.assert_close(attention_mass(attn, mask), torch.tensor([0.25, 1 / 64, 0.0]))


def _digest(root):
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "ambiguous" not in p.as_posix()}


def test_ambiguous_split_is_deterministic_and_leaves_the_world_alone(mini_world, tmp_path):
    from foco.world.ambiguous import generate_ambiguous_split, load_ambiguous, object_box
    from foco.world.manifest import load_benchmark
    from foco.world.render import render_scene
    from foco.world.scene import Scene
    before = _digest(mini_world)
    s1 = generate_ambiguous_split(mini_world, "test", n_queries=12)
    assert _digest(mini_world) == before
    generate_ambiguous_split(mini_world, "test", n_queries=12, out=tmp_path / "again")
    for name in ("gallery.jsonl", "queries.jsonl"):
        rel = f"benchmarks/test-ambiguous/single/{name}"
        assert (mini_world / rel).read_bytes() == (tmp_path / "again" / rel).read_bytes()
    bench = load_benchmark(mini_world, "test-ambiguous", "single")
    ann = load_ambiguous(mini_world, "test")
    assert len(bench.query_ids) == s1["queries"] == len(ann.confusers) >= 10
    scenes = {g["id"]: Scene.from_dict(g["scene"]) for g in map(json.loads, (
        mini_world / "benchmarks/test-ambiguous/single/gallery.jsonl").read_text().splitlines())}
    for q in range(len(bench.query_ids)):
        ref = scenes[bench.references[q]]
        kinds = [o.kind for o in ref.objects]
        assert max(kinds.count(k) for k in kinds) == 2
        assert " it" in f" {bench.modifications[q]}" and ann.confusers[q] in bench.subsets[q]
        assert scenes[ann.confusers[q]].semantic_key() != scenes[bench.targets[q][0]].semantic_key()
        boxed = [o for o in ref.objects if np.allclose(object_box(o), ann.boxes[q].tolist(), atol=1e-3)]
        assert len(boxed) == 1 and kinds.count(boxed[0].kind) == 2
    # the box holds every pixel its object changes
    obj = ref.objects[0]
    with_obj = np.asarray(render_scene(ref), dtype=int)
    without = np.asarray(render_scene(Scene(ref.background, ref.objects[1:])), dtype=int)
    ys, xs = np.nonzero(np.abs(with_obj - without).sum(-1) > 30)
    x0, y0, x1, y1 = object_box(obj)
    assert xs.min() >= x0 - 1.5 and xs.max() <= x1 + 1.5 and ys.min() >= y0 - 1.5 and ys.max() <= y1 + 1.5


def test_box_moves_foco_attention_into_the_box(mini_world, world_bb, tmp_path):
    from foco.eval.box import evaluate_box_anchoring
    from foco.eval.select import choose_beta
    from foco.world.ambiguous import generate_ambiguous_split, load_ambiguous
    generate_ambiguous_split(mini_world, "val", n_queries=12, out=tmp_path)
    extract_world_split(world_bb, tmp_path, "val-ambiguous/single", tmp_path / "cache", ExtractConfig(dtype="float32"))
    bench, feats = load_world_part(tmp_path, "val-ambiguous", "single", tmp_path / "cache")
    torch.manual_seed(0)
    model = ComposedQueryEncoder(FoCoConfig(dim=32)).eval()
    betas = (-2.0, 0.0, 1.0, 4.0)
    res = evaluate_box_anchoring(FoCoMethod(model), bench, feats, load_ambiguous(tmp_path, "val"),
                                 grid=SMALL.image_size // 8, betas=betas)
    mass = [res[b]["attn_in_box"] for b in betas]
    assert mass == sorted(mass) and len(set(mass)) == len(mass) and mass[-1] > 50, mass
    assert all(0 <= res[b]["instance_acc"] <= 100 and "R@1" in res[b] for b in res)
    assert choose_beta(res) in betas
    assert choose_beta({-1.0: {"R@1": 5.0}, 0.0: {"R@1": 5.0}, 2.0: {"R@1": 1.0}}) == 0.0


def test_evaluate_uses_the_slerp_alpha_it_is_given(val_features):
    """A numeric --slerp-alpha reaches the method (it was once ignored for the options' default 0.5)."""
    from foco.eval.evaluate import EvalConfig, evaluate
    from foco.methods import MethodOptions
    bench, feats = val_features
    runs = {a: evaluate([bench], lambda b: feats, EvalConfig(methods=("slerp",), options=MethodOptions(
        slerp_alpha=a)))["methods"]["slerp"] for a in (0.2, 0.5, 0.8)}
    assert runs[0.2] != runs[0.5] != runs[0.8]
    default = evaluate([bench], lambda b: feats, EvalConfig(methods=("slerp",)))
    assert default["methods"]["slerp"] == runs[0.5]  # no alpha given: slerp's own default, 0.5
