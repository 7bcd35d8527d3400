"""AdaFocal (OACIR): CAAM's modulation, the three variants, the supervised trainer and the method, on tiny tensors."""
from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from foco.backbones.base import ImageFeatures, TextFeatures
from foco.methods import build_method
from foco.methods.adafocal import AdaFocalConfig, AdaFocalMethod, AdaFocalModel
from foco.methods.base import QueryBatch
from foco.model.caam import CAAM, CAAMConfig, apply_bias_naive
from foco.model.encoder import FoCoConfig, shape_fields
from foco.train.adafocal import AdaFocalTrainConfig, Quadruples, quadruples_from_parts, train_adafocal

D, P, L, B = 16, 16, 5, 3


def tiny_foco(**kw) -> FoCoConfig:
    return FoCoConfig(dim=D, heads=2, comp_depth=1, **{**shape_fields("compact"), **kw})


def inputs(seed: int = 0, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    ref_g = F.normalize(torch.randn(B, D, generator=g), dim=-1)  # (B, D)
    patches = torch.randn(B, P, D, generator=g)  # (B, P, D)
    tokens = torch.randn(B, L, D, generator=g)  # (B, L, D)
    mask = torch.ones(B, L, dtype=torch.bool)
    mask[1, 3:] = False  # padding
    box = torch.zeros(B, P, dtype=torch.bool)
    box[0, [0, 1, 4, 5]] = True
    box[1, 10] = True  # row 2: no box
    return tuple(t.to(device) for t in (ref_g, patches, tokens, mask, box))


CONFIGS = list(itertools.product(("mlp", "pool"), (True, False), ("scalar", "vector")))


@pytest.mark.parametrize("crm,learnable,beta", CONFIGS)
def test_caam_shapes_and_bias(crm, learnable, beta):
    torch.manual_seed(0)
    caam = CAAM(CAAMConfig(dim=D, probes=4, layers=2, heads=2, crm=crm, learnable_probes=learnable, beta=beta))
    ref_g, patches, tokens, mask, box = inputs()
    mod = caam(ref_g, patches, tokens, mask, box)
    assert mod.beta.shape == ((B, 1) if beta == "scalar" else (B, P))
    assert mod.bias.shape == (B, P)
    assert torch.all(mod.beta > 0)  # softplus, starting near init_beta
    assert torch.allclose(mod.beta, torch.full_like(mod.beta, 1.0), atol=0.2)
    assert torch.all(mod.bias[~box] == 0)  # zero outside the box
    assert torch.all(mod.bias[2] == 0)  # the row without a box
    assert torch.all(mod.bias[box] > 0)
    torch.testing.assert_close(mod.bias, apply_bias_naive(mod.beta, box))  # the slow, obvious twin


def test_padding_is_ignored():
    caam = CAAM(CAAMConfig(dim=D, probes=2, layers=1, heads=2)).eval()
    ref_g, patches, tokens, mask, box = inputs()
    changed = tokens.clone()
    changed[1, 3:] = 100.0  # padded positions of row 1
    a = caam(ref_g, patches, tokens, mask, box).beta
    b = caam(ref_g, patches, changed, mask, box).beta
    torch.testing.assert_close(a, b)


def test_frozen_probes_get_no_gradient_and_learnable_ones_do():
    ref_g, patches, tokens, mask, box = inputs()
    frozen = CAAM(CAAMConfig(dim=D, probes=4, layers=1, heads=2, learnable_probes=False, seed=3))
    assert "probes" not in dict(frozen.named_parameters()) and "probes" in frozen.state_dict()
    frozen(ref_g, patches, tokens, mask, box).bias.sum().backward()
    assert not frozen.probes.requires_grad and frozen.probes.grad is None
    assert frozen.types.grad[0].abs().sum() == 0  # nothing learned reaches the probe tokens (no type shift)
    again = CAAM(CAAMConfig(dim=D, probes=4, layers=1, heads=2, learnable_probes=False, seed=3))
    torch.testing.assert_close(again.probes, frozen.probes)  # seeded: the same fixed probes
    learn = CAAM(CAAMConfig(dim=D, probes=4, layers=1, heads=2, learnable_probes=True))
    learn(ref_g, patches, tokens, mask, box).bias.sum().backward()
    assert learn.probes.grad is not None and learn.probes.grad.abs().sum() > 0
    assert learn.types.grad[0].abs().sum() > 0


def test_new_tensors_follow_the_inputs_device():
    """On the meta device, any tensor made on the CPU in forward would fail to combine with the inputs."""
    ref_g, patches, tokens, mask, box = inputs(device="meta")
    for beta in ("scalar", "vector"):
        caam = CAAM(CAAMConfig(dim=D, probes=2, layers=1, heads=2, beta=beta)).to("meta")
        mod = caam(ref_g, patches, tokens, mask, box)
        assert mod.bias.device.type == "meta" and mod.beta.device.type == "meta"
    for variant in ("caam", "none", "fixed"):
        model = AdaFocalModel(AdaFocalConfig(variant, tiny_foco(), CAAMConfig(dim=D, probes=2, layers=1, heads=2),
                                             fixed_beta=2.0)).to("meta")
        bias, _ = model.attention_bias(ImageFeatures(ref_g, patches), TextFeatures(ref_g, tokens, mask), box)
        assert bias is None if variant == "none" else bias.device.type == "meta"


def test_variants_and_box_effect():
    torch.manual_seed(0)
    ref_g, patches, tokens, mask, box = inputs()
    ref, mod = ImageFeatures(ref_g, patches), TextFeatures(ref_g, tokens, mask)
    caam_cfg = CAAMConfig(dim=D, probes=2, layers=1, heads=2)
    none = AdaFocalModel(AdaFocalConfig("none", tiny_foco(), caam_cfg)).eval()
    assert none.caam is None
    torch.testing.assert_close(none(ref, mod, box).query, none(ref, mod, None).query)  # the box is ignored
    fixed = AdaFocalModel(AdaFocalConfig("fixed", tiny_foco(), caam_cfg, fixed_beta=3.0)).eval()
    fixed.encoder.load_state_dict(none.encoder.state_dict())
    with_box, without = fixed(ref, mod, box), fixed(ref, mod, None)
    inside = lambda att: (att * box.float()).sum(-1)  # noqa: E731
    assert torch.all(inside(with_box.attention)[:2] > inside(without.attention)[:2])
    torch.testing.assert_close(with_box.query[2], without.query[2])  # no box in row 2
    with pytest.raises(ValueError, match="variant"):
        AdaFocalModel(AdaFocalConfig("bogus", tiny_foco(), caam_cfg))


def synthetic(n: int = 96, seed: int = 0) -> Quadruples:
    """The target is the boxed patch's direction: only the box says which patch the query is about."""
    g = torch.Generator().manual_seed(seed)
    patches = torch.randn(n, P, D, generator=g)  # (N, P, D)
    where = torch.randint(0, P, (n,), generator=g)  # (N,)
    box = F.one_hot(where, P).bool()  # (N, P)
    target = F.normalize(patches[torch.arange(n), where], dim=-1)  # (N, D)
    tokens = torch.randn(n, L, D, generator=g)  # (N, L, D)
    text = TextFeatures(F.normalize(tokens.mean(1), dim=-1), tokens, torch.ones(n, L, dtype=torch.bool))
    return Quadruples(F.normalize(patches.mean(1), dim=-1), patches, text, box, target,
                      [f"inst{i % 7}" for i in range(n)])


def test_training_lowers_the_loss_and_the_checkpoint_reproduces_queries(tmp_path):
    data = synthetic()
    cfg = AdaFocalTrainConfig(variant="caam", caam=CAAMConfig(probes=2, layers=1, heads=2), foco=tiny_foco(
        learn_bias=True), epochs=6, batch_size=32, lr=3e-3, seed=0, device="cpu")
    model = train_adafocal(data, tmp_path / "run", cfg,
                           meta={"provenance": {"backbone": {"spec": "world:test"}}})
    log = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    losses = [rec["loss"] for rec in log]
    assert losses[-1] < losses[0]
    record = json.loads((tmp_path / "run" / "adafocal.json").read_text())
    assert record["variant"] == "caam" and record["provenance"]["backbone"]["spec"] == "world:test"
    method = build_method("adafocal", opts=None, adafocal=tmp_path / "run")
    assert isinstance(method, AdaFocalMethod) and method.reads_box
    rows = torch.arange(8)
    ref, mod, box, _ = data.batch(rows, "cpu")
    loaded = method.encode(QueryBatch(ref, mod, ["t"] * 8, box_mask=box)).query
    with torch.inference_mode():
        torch.testing.assert_close(loaded, model(ref, mod, box).query)
    with pytest.raises(ValueError, match="box_mask"):
        method.encode(QueryBatch(ref, mod, ["t"] * 8, attn_bias=box.float()))


def test_resumed_run_is_refused_without_resume(tmp_path):
    data = synthetic(n=16)
    cfg = AdaFocalTrainConfig(variant="none", foco=tiny_foco(), epochs=1, batch_size=8, device="cpu")
    train_adafocal(data, tmp_path / "r", cfg)
    with pytest.raises(FileExistsError):
        train_adafocal(data, tmp_path / "r", cfg)
    train_adafocal(data, tmp_path / "r", cfg, resume=True)  # done already: continues to the same end


def test_quadruples_check_shapes():
    data = synthetic(n=8)
    with pytest.raises(ValueError, match="box_mask"):
        Quadruples(data.ref_global, data.ref_patches, data.text, data.box_mask[:, :4], data.target_global,
                   data.instance_ids)


def test_quadruples_from_parts():
    data = synthetic(n=4)
    boxes = [(0, 0, 16, 16), (48, 48, 64, 64), (0, 0, 64, 64), None]
    subsets = [["r0", "g3", "g0", "g1"], ["r1", "g2"], ["r2", "g1", "g0"], ["r3", "g0", "g2", "g3"]]
    queries = [SimpleNamespace(id=f"q{i}", reference=f"r{i}", texts=(f"t{i}",), targets=[f"g{3 - i}"], box=boxes[i],
                               box_size=None if boxes[i] is None else (64, 64), instance=f"i{i % 2}",
                               subset=subsets[i]) for i in range(4)]
    bench = SimpleNamespace(name="world/oacir", split="train", queries=queries)

    class Texts:
        def take(self, rows):
            return TextFeatures(data.text.global_[rows], data.text.tokens[rows], data.text.mask[rows])

    feats = SimpleNamespace(reference_ids=[f"r{i}" for i in range(4)],
                            references=ImageFeatures(data.ref_global, data.ref_patches),
                            text_ids=[f"t{i}" for i in range(4)], texts=Texts(),
                            gallery_ids=[f"g{i}" for i in range(4)], gallery=data.target_global)
    q = quadruples_from_parts(bench, feats)
    assert q.box_mask[0].nonzero().flatten().tolist() == [0]
    assert q.box_mask[1].nonzero().flatten().tolist() == [15]
    assert q.box_mask[2].all() and not q.box_mask[3].any()
    torch.testing.assert_close(q.target_global, data.target_global.flip(0))
    assert q.instance_ids == ["i0", "i1", "i0", "i1"]
    # hard negatives: each subset without its reference and target, padded to the longest
    assert q.hard_mask.tolist() == [[True, True], [False, False], [True, False], [True, True]]
    torch.testing.assert_close(q.hard[0], data.target_global[[0, 1]])
    torch.testing.assert_close(q.hard[2, 0], data.target_global[0])
    torch.testing.assert_close(q.hard[3], data.target_global[[2, 3]])


def test_hard_negatives_enter_the_loss_as_negatives_only():
    from foco.train.adafocal import sigmoid_loss
    from foco.methods.adafocal import AdaFocalConfig, AdaFocalModel
    torch.manual_seed(0)
    model = AdaFocalModel(AdaFocalConfig("none", tiny_foco(), CAAMConfig(dim=D, heads=2)))
    q, t = F.normalize(torch.randn(3, D), dim=-1), F.normalize(torch.randn(3, D), dim=-1)
    hard = F.normalize(torch.randn(3, 2, D), dim=-1)
    none = torch.zeros(3, 2, dtype=torch.bool)
    assert torch.equal(sigmoid_loss(model, q, t, (hard, none)), sigmoid_loss(model, q, t))  # masked out: no term
    mask = torch.tensor([[True, False], [False, False], [True, True]])
    scale, bias = model.encoder.log_scale_comp.exp(), model.encoder.bias_comp
    extra = sum(-F.logsigmoid(-(scale * q[b] @ hard[b, m] + bias)) for b in range(3) for m in range(2) if mask[b, m])
    torch.testing.assert_close(sigmoid_loss(model, q, t, (hard, mask)), sigmoid_loss(model, q, t) + extra / 3)


def test_cli_maps_flags_onto_the_config(monkeypatch, tmp_path):
    from foco.cli import adafocal as cli
    from foco.cli import main
    seen = {}
    monkeypatch.setattr(cli, "train_on_world", lambda *args: seen.setdefault("args", args))
    rc = main(["adafocal", "train", "--features", "f", "--world", "w", "--out", str(tmp_path / "o"), "--variant",
               "caam", "--probes", "4", "--layers", "1", "--crm", "pool", "--frozen-probes", "--beta", "vector",
               "--epochs", "2", "--batch-size", "16", "--seed", "5", "--device", "cpu"])
    assert rc == 0
    features, world, split, out, cfg, resume = seen["args"]
    assert (str(features), str(world), split) == ("f", "w", "train")
    assert cfg.caam.probes == 4 and cfg.caam.layers == 1 and cfg.caam.crm == "pool"
    assert not cfg.caam.learnable_probes and cfg.caam.beta == "vector"
    assert (cfg.epochs, cfg.batch_size, cfg.seed, cfg.device) == (2, 16, 5, "cpu")


def test_perturbed_boxes_have_the_asked_iou():
    from foco.model.box import box_iou, perturb_boxes
    g = torch.Generator().manual_seed(0)
    x0y0 = torch.rand(50, 2, generator=g) * 40
    boxes = torch.cat([x0y0, x0y0 + 4 + torch.rand(50, 2, generator=g) * 20], 1)  # (50, 4), not square
    scaled = perturb_boxes(boxes, 0.8, shift=False, generator=g)
    torch.testing.assert_close(box_iou(boxes, scaled), torch.full((50,), 0.8), atol=1e-5, rtol=0)
    torch.testing.assert_close((scaled[:, :2] + scaled[:, 2:]) / 2, (boxes[:, :2] + boxes[:, 2:]) / 2)  # centred
    moved = perturb_boxes(boxes, 0.5, shift=True, generator=g)
    torch.testing.assert_close(box_iou(boxes, moved), torch.full((50,), 0.5), atol=1e-4, rtol=0)
    size = lambda b: b[:, 2:] - b[:, :2]  # noqa: E731
    torch.testing.assert_close(size(moved), size(boxes) / 0.8 ** 0.5)  # grown as "scale", then moved
    assert ((moved[:, :2] + moved[:, 2:]) / 2 - (boxes[:, :2] + boxes[:, 2:]) / 2).norm(dim=1).min() > 0.1
    with pytest.raises(ValueError, match="IoU"):
        perturb_boxes(boxes, 0.9, shift=True, generator=g)


def test_boxes_map_onto_the_centre_square_and_a_box_outside_it_is_refused():
    from foco.model.box import query_box_masks
    q = lambda i, box, size: SimpleNamespace(id=f"q{i}", box=box, box_size=size)  # noqa: E731
    # a 128 x 64 image: the towers see x in [32, 96); a box on its left quarter of that square is patch column 0
    masks = query_box_masks([q(0, (32, 0, 40, 8), (128, 64)), q(1, None, None)], 16)
    assert masks[0].nonzero().flatten().tolist() == [0] and not masks[1].any()
    with pytest.raises(ValueError, match="q2 lies outside the centre square"):
        query_box_masks([q(2, (0, 0, 20, 20), (128, 64))], 16)
    with pytest.raises(ValueError, match="q3 has a box but not the size"):
        query_box_masks([q(3, (0, 0, 20, 20), None)], 16)
    assert query_box_masks([q(4, None, None)], 16) is None


def test_r_id_needs_every_gallery_images_instances():
    from foco.benchmarks.base import CIRBenchmark, CIRQuery, EvalProtocol
    from foco.eval.rank import rank, score
    proto = EvalProtocol(remove_reference=True, recall_ks=(1,), instance_ks=(1,), average=("R_ID@1", "R@1"))
    bench = CIRBenchmark("t", "test", {}, ["a", "b", "c"], [CIRQuery("q", "a", ("t",), ["b"], instance="x")], proto,
                         instances={"a": ("x",), "b": ("y",), "c": ("x",)})
    gallery = torch.eye(3)
    r = rank(bench, ["a", "b", "c"], gallery, torch.tensor([[0.0, 0.2, 1.0]]))
    assert score(bench, r) == {"R_ID@1": 100.0, "R@1": 0.0, "Avg": 50.0}  # c shows x; the reference a is removed
    bench.instances.pop("c")
    with pytest.raises(ValueError, match="without their instances"):
        score(bench, r)


@pytest.mark.slow
def test_the_search_engine_hands_adafocal_the_box_and_foco_its_fixed_beta(tiny_world, tmp_path):
    """`foco search` / `foco serve`: a box reaches AdaFocal as a mask (its beta its own), FoCo as the server's fixed
    beta; both map it onto the centre square as evaluation does; a method without attention refuses a box."""
    pytest.importorskip("faiss")
    from foco.methods.adafocal import AdaFocalConfig, AdaFocalModel
    from foco.model import ComposedQueryEncoder
    from foco.search.build import IndexConfig, build_index
    from foco.search.engine import Query, QueryError, SearchEngine
    images = tmp_path / "imgs"
    images.mkdir()
    for p in sorted((tiny_world / "images" / "test-single").glob("*.png"))[:12]:
        (images / p.name).write_bytes(p.read_bytes())
    build_index(IndexConfig(images=str(images), backbone="world:pretrained", with_patches=True), tmp_path / "idx")
    torch.manual_seed(0)
    caam = CAAMConfig(dim=256, probes=2, layers=1, init_beta=8.0)
    model = AdaFocalModel(AdaFocalConfig("caam", FoCoConfig(dim=256, learn_bias=True), caam))
    model.save(tmp_path / "ada", {"provenance": {"backbone": {"spec": "world:pretrained"}}})
    ComposedQueryEncoder(FoCoConfig(dim=256, learn_bias=True)).save(tmp_path / "foco", {"backbone": "world:pretrained"})
    engine = SearchEngine.open(tmp_path / "idx", adafocal=tmp_path / "ada", checkpoint=tmp_path / "foco")
    for method in ("adafocal", "foco"):
        plain = engine.search(Query("make it red", 3, method, k=5))
        boxed = engine.search(Query("make it red", 3, method, k=5, box=(0, 0, 32, 32)))
        assert not torch.allclose(plain.attention, boxed.attention), method  # the box moved F_Aggr's attention
        again = engine.search_many([Query("make it red", 3, method, k=5, box=(0, 0, 32, 32)),
                                    Query("make it red", 3, method, k=5)])
        assert torch.allclose(again[0].attention, boxed.attention, atol=1e-5)  # batched with a box-less query
        assert torch.allclose(again[1].attention, plain.attention, atol=1e-5)
    with pytest.raises(QueryError, match="has none"):
        engine.search(Query("make it red", 3, "sum", k=5, box=(0, 0, 32, 32)))
