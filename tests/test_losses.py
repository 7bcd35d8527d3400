"""The batched cross-instance losses and the composed-query encoder against slow per-pair twins."""
import pytest
import torch
import torch.nn.functional as F

from foco.backbones.base import ImageFeatures, TextFeatures
from foco.train.data import TrainBatch
from foco.train.losses import foco_losses, plan_negatives
from foco.model import ComposedQueryEncoder, FoCoConfig
from foco.naive import aggr_one as naive_aggr, comp_one as naive_comp, losses_per_pair as slow_losses


def random_batch(B=6, K=3, L=5, P=4, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    local_mask = torch.ones(B, K, dtype=torch.bool)
    local_mask[0, 2] = local_mask[3, 1:] = False
    ctx_mask = torch.rand(B, K, L, generator=g) > 0.3
    ctx_mask[..., 0] = True
    ctx_mask[1, 0] = False  # a context with no tokens at all: attention still has the visual entries
    return TrainBatch(
        image_global=F.normalize(torch.randn(B, D, generator=g, dtype=torch.float64), dim=-1),
        patches=torch.randn(B, P, D, generator=g, dtype=torch.float64),
        local=F.normalize(torch.randn(B, K, D, generator=g, dtype=torch.float64), dim=-1),
        local_mask=local_mask,
        ctx_tokens=torch.randn(B, K, L, D, generator=g, dtype=torch.float64),
        ctx_mask=ctx_mask)


@pytest.mark.parametrize("with_comp", [False, True])
@pytest.mark.parametrize("cap", [None, 3])
@pytest.mark.parametrize("learn_bias", [False, True])
def test_batched_losses_match_per_pair_reference(with_comp, cap, learn_bias):
    torch.manual_seed(0)
    model = ComposedQueryEncoder(FoCoConfig(dim=16, heads=2, learn_bias=learn_bias, init_bias=-2.0)).double()
    if not learn_bias:
        model.bias_aggr.data.zero_(); model.bias_comp.data.zero_()
    for p in model.parameters():  # move away from the initialisation so every path matters
        p.data.add_(0.05 * torch.randn_like(p))
    b = random_batch()
    plan = plan_negatives(b.local_mask, cap, torch.Generator().manual_seed(1))
    assert (b.local_mask[torch.arange(6), plan.neg_k]).all()
    if cap is not None:
        assert len(plan.columns) == cap + 1
    fast = foco_losses(model, b, plan, with_comp)
    slow = slow_losses(model, b, plan, with_comp)
    for name in slow:
        assert torch.allclose(fast[name], slow[name], atol=1e-5, rtol=1e-5), name
    # gradients agree too
    gf = torch.autograd.grad(fast["loss"], [p for p in model.parameters() if p.requires_grad], allow_unused=True)
    total_slow = slow["loss"]
    gs = torch.autograd.grad(total_slow, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
    for a, s in zip(gf, gs):
        if a is None or s is None:
            assert (a is None or a.abs().max() == 0) and (s is None or s.abs().max() == 0)
        else:
            assert torch.allclose(a, s, atol=1e-5, rtol=1e-4)


def test_paper_exact_has_no_bias():
    model = ComposedQueryEncoder(FoCoConfig(dim=16, heads=2))
    assert not model.bias_aggr.requires_grad
    # the paper-exact setting uses b = 0, frozen
    assert float(model.bias_aggr) == 0.0 and float(model.bias_comp) == 0.0


def test_encode_matches_per_query_reference():
    torch.manual_seed(0)
    model = ComposedQueryEncoder(FoCoConfig(dim=16, heads=2)).double()
    b = random_batch(B=4)
    ref = ImageFeatures(b.image_global, b.patches)
    mod = TextFeatures(b.local[:, 0], b.ctx_tokens[:, 0], b.ctx_mask[:, 0])
    out = model.encode(ref, mod)
    for i in range(4):
        v, bg, alpha = naive_aggr(model.aggr, mod.global_[i], ref.global_[i], ref.patches[i])
        h = naive_comp(model.comp, v, bg, mod.tokens[i], mod.mask[i])
        assert torch.allclose(out.query[i], h, atol=1e-10)
        assert torch.allclose(out.attention[i], alpha, atol=1e-10)
    assert torch.allclose(out.query.norm(dim=-1), torch.ones(4, dtype=torch.float64))


@pytest.mark.parametrize("variant", [{"use_background": False}, {"anchor_init": False}])
def test_ablation_variants_match_reference(variant):
    torch.manual_seed(0)
    model = ComposedQueryEncoder(FoCoConfig(dim=16, heads=2, **variant)).double()
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn_like(p))
    b = random_batch(B=4)
    plan = plan_negatives(b.local_mask, None, torch.Generator().manual_seed(2))
    fast, slow = foco_losses(model, b, plan, True), slow_losses(model, b, plan, True)
    assert torch.allclose(fast["comp"], slow["comp"], atol=1e-5, rtol=1e-5)


def _moved(cfg: FoCoConfig) -> ComposedQueryEncoder:
    torch.manual_seed(0)
    model = ComposedQueryEncoder(cfg).double()
    for p in model.parameters():  # move away from the initialisation so every path matters
        p.data.add_(0.05 * torch.randn_like(p))
    return model


def _same_losses_and_grads(fast: dict, slow: dict, model) -> None:
    assert set(fast) == set(slow)
    for name in slow:
        assert torch.allclose(fast[name], slow[name], atol=1e-8, rtol=1e-8), (name, fast[name], slow[name])
    params = [p for p in model.parameters() if p.requires_grad]
    gf = torch.autograd.grad(fast["loss"], params, allow_unused=True)
    gs = torch.autograd.grad(slow["loss"], params, allow_unused=True)
    for a, s in zip(gf, gs):
        if a is None or s is None:
            assert (a is None or a.abs().max() == 0) and (s is None or s.abs().max() == 0)
        else:
            assert torch.allclose(a, s, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("loss,negatives", [("infonce", "cross-instance"), ("sigmoid", "naive"), ("infonce", "naive"),
                                           ("sigmoid", "naive-aggr"), ("sigmoid", "naive-comp")])
@pytest.mark.parametrize("with_comp", [False, True])
@pytest.mark.parametrize("cap", [None, 3])
def test_ablated_objectives_match_per_pair_twins(loss, negatives, with_comp, cap):
    """2a (InfoNCE), 2b and 2c (naive intra-image negatives in L_aggr, in L_comp) and both at once, batched over the
    grid against the per-pair loop."""
    model = _moved(FoCoConfig(dim=16, heads=2, learn_bias=True, init_bias=-2.0))
    b = random_batch()
    plan = plan_negatives(b.local_mask, cap, torch.Generator().manual_seed(1))
    fast = foco_losses(model, b, plan, with_comp, loss=loss, negatives=negatives)
    slow = slow_losses(model, b, plan, with_comp, loss=loss, negatives=negatives)
    _same_losses_and_grads(fast, slow, model)
    # and they are other losses than the paper's
    paper = foco_losses(model, b, plan, with_comp)
    if negatives == "naive-comp" and not with_comp:  # 2c changes L_comp alone: stage 1 is the paper's
        assert torch.equal(fast["loss"], paper["loss"])
    else:
        assert not torch.allclose(fast["loss"], paper["loss"])
    if negatives in ("naive-aggr", "naive-comp"):  # 2b changes L_aggr alone, 2c L_comp alone
        same, changed = ("comp", "aggr") if negatives == "naive-aggr" else ("aggr", "comp")
        if same in paper:
            assert torch.equal(fast[same], paper[same])
        if changed in paper:
            assert not torch.allclose(fast[changed], paper[changed])


@pytest.mark.parametrize("variant", [{"aggr_query": "learned"}, {"aggr_query": "text"},
                                     {"aggr_attention": "dot-product"}, {"comp_layers": "attention"},
                                     {"aggr_query": "learned", "aggr_attention": "dot-product"}])
def test_ablated_modules_match_per_pair_twins(variant):
    """4a (a learned query, or the text alone), 4b (dot-product attention) and 5a (one attention layer in F_Comp):
    the batched grid and the encoder against the per-pair and per-query twins."""
    model = _moved(FoCoConfig(dim=16, heads=2, **variant))
    b = random_batch(B=4)
    plan = plan_negatives(b.local_mask, None, torch.Generator().manual_seed(2))
    _same_losses_and_grads(foco_losses(model, b, plan, True), slow_losses(model, b, plan, True), model)
    ref = ImageFeatures(b.image_global, b.patches)
    mod = TextFeatures(b.local[:, 0], b.ctx_tokens[:, 0], b.ctx_mask[:, 0])
    out = model.encode(ref, mod)
    for i in range(4):
        v, bg, alpha = naive_aggr(model.aggr, mod.global_[i], ref.global_[i], ref.patches[i])
        assert torch.allclose(out.query[i], naive_comp(model.comp, v, bg, mod.tokens[i], mod.mask[i]), atol=1e-10)
        assert torch.allclose(out.attention[i], alpha, atol=1e-10)


def test_unknown_ablation_values_are_refused():
    with pytest.raises(ValueError, match="learned"):
        ComposedQueryEncoder(FoCoConfig(dim=16, heads=2, aggr_query="none"))
    with pytest.raises(ValueError, match="dot-product"):
        ComposedQueryEncoder(FoCoConfig(dim=16, heads=2, aggr_attention="dot"))
    with pytest.raises(ValueError, match="attention"):
        ComposedQueryEncoder(FoCoConfig(dim=16, heads=2, comp_layers="none"))


@pytest.mark.parametrize("attention", ["cross-attention", "dot-product"])
@pytest.mark.parametrize("background", ["complement", "reciprocal", "negated-softmax", "below-uniform"])
def test_background_readings_match_per_pair_reference(background, attention):
    """Each reading of the background (model.aggr) against its per-pair twin (naive.aggr_one): the background
    itself, and the composed query and the losses that read it."""
    model = _moved(FoCoConfig(dim=16, heads=2, background=background, aggr_attention=attention))
    b = random_batch(B=4, P=6)
    ref = ImageFeatures(b.image_global, b.patches)
    mod = TextFeatures(b.local[:, 0], b.ctx_tokens[:, 0], b.ctx_mask[:, 0])
    _, bg, alpha = model.aggr(mod.global_[:, None], ref.global_, ref.patches)
    out = model.encode(ref, mod)
    for i in range(4):
        v, bg_i, alpha_i = naive_aggr(model.aggr, mod.global_[i], ref.global_[i], ref.patches[i])
        assert torch.allclose(bg[i, 0], bg_i, atol=1e-10), (background, i)
        assert torch.allclose(alpha[i, 0], alpha_i, atol=1e-10)
        assert torch.allclose(out.query[i], naive_comp(model.comp, v, bg_i, mod.tokens[i], mod.mask[i]), atol=1e-10)
    plan = plan_negatives(b.local_mask, None, torch.Generator().manual_seed(2))
    fast, slow = foco_losses(model, b, plan, True), slow_losses(model, b, plan, True)
    assert torch.allclose(fast["comp"], slow["comp"], atol=1e-5, rtol=1e-5)


def test_background_weights_by_hand():
    from foco.model.aggr import RECIPROCAL_FLOOR, background_weights
    alpha = torch.tensor([[0.7, 0.2, 0.1, 0.0]], dtype=torch.float64)  # (1, P = 4)
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 0.0, 0.0]]], dtype=torch.float64)  # (1, h = 2, P)
    got = {r: background_weights(r, alpha, logits)[0] for r in ("complement", "reciprocal", "negated-softmax",
                                                                   "below-uniform")}
    assert torch.allclose(got["complement"], torch.tensor([0.3, 0.8, 0.9, 1.0], dtype=torch.float64) / 3.0)
    recip = torch.tensor([1 / 0.7, 1 / 0.2, 1 / 0.1, 1 / (RECIPROCAL_FLOOR / 4)], dtype=torch.float64)
    assert torch.allclose(got["reciprocal"], recip / recip.sum())
    e = torch.exp(torch.tensor([-2.0, -1.0, 0.0, 1.0], dtype=torch.float64))
    assert torch.allclose(got["negated-softmax"], (e / e.sum() + 0.25) / 2)
    assert torch.allclose(got["below-uniform"], torch.tensor([0, 0.05, 0.15, 0.25], dtype=torch.float64) / 0.45)
    uniform = torch.full((1, 4), 0.25, dtype=torch.float64)  # no patch below a uniform map: the plain mean
    assert torch.allclose(background_weights("below-uniform", uniform, logits)[0], uniform[0])
    with pytest.raises(ValueError, match="background 'inverse'"):
        background_weights("inverse", alpha, logits)


def test_the_complement_background_is_nearly_the_patch_mean():
    """Issue 26's finding, as arithmetic: with weights 1 - α, v̄ - mean(V) = (mean(V) - Σ α_p V_p) / (P - 1); the
    other readings move with the attention."""
    from foco.model.aggr import background_weights
    g = torch.Generator().manual_seed(0)
    P, D = 256, 64
    V = torch.randn(P, D, generator=g, dtype=torch.float64) + 1.0
    logits = 3 * torch.randn(1, 8, P, generator=g, dtype=torch.float64)
    alpha = logits.softmax(-1).mean(-2)  # (1, P)
    mean, attended = V.mean(0), alpha[0] @ V
    bg = background_weights("complement", alpha, logits)[0] @ V
    assert torch.allclose(bg - mean, (mean - attended) / (P - 1), atol=1e-12)
    shift = {r: ((background_weights(r, alpha, logits)[0] @ V - mean).norm() / mean.norm()).item()
             for r in ("complement", "reciprocal", "negated-softmax", "below-uniform")}
    assert shift["complement"] < 0.01 and all(shift[r] > 3 * shift["complement"] for r in shift if r != "complement")
