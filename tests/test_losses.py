"""The batched cross-instance losses and the composed-query encoder against slow per-pair twins."""
import math

import pytest
import torch
import torch.nn.functional as F

from foco.backbones.base import ImageFeatures, TextFeatures
from foco.losses import NegativePlan, TrainBatch, foco_losses, plan_negatives
from foco.model import ComposedQueryEncoder, FoCoConfig


def naive_aggr(aggr, c, vg, patches):
    """One image, one anchor, written out from the paper's equations."""
    D = c.shape[0]
    h = aggr.heads
    dh = D // h
    query = aggr.query_mlp(c * vg)
    q = aggr.q_proj(aggr.norm_q(query)).view(h, dh)
    x = aggr.norm_kv(patches)
    k = aggr.k_proj(x).view(-1, h, dh)
    v = aggr.v_proj(x).view(-1, h, dh)
    att = torch.softmax((k * q).sum(-1) / math.sqrt(dh), dim=0)  # (P, h)
    out = (att[..., None] * v).sum(0).reshape(D)
    xq = query + aggr.o_proj(out)
    v_loc = xq + aggr.ffn(xq)
    alpha = att.mean(1)
    w = (1 - alpha) / (1 - alpha).sum()
    return v_loc, w @ patches, alpha


def naive_comp(comp, v_loc, bg, tokens, mask):
    """One query: S = [f_t(X); f_v(v_loc); f_v(bg)] built explicitly, then plain softmax attention."""
    D = v_loc.shape[0]
    S = torch.cat([comp.f_t(tokens[mask]), comp.f_v(torch.stack([v_loc, bg]))])
    q = v_loc + comp.query_token
    for blk in comp.blocks:
        h = blk.heads
        dh = D // h
        Q = blk.q_proj(q).view(h, dh)
        K = blk.k_proj(S).view(-1, h, dh)
        V = blk.v_proj(S).view(-1, h, dh)
        att = torch.softmax((K * Q).sum(-1) / math.sqrt(dh), dim=0)
        o = (att[..., None] * V).sum(0).reshape(D)
        x = blk.norm1(q + blk.o_proj(o))
        q = blk.norm2(x + blk.ffn(x))
    return F.normalize(comp.out(q), dim=-1)


def slow_losses(model, b: TrainBatch, plan: NegativePlan, with_comp: bool):
    B, K, _ = b.local.shape
    s_a, s_c = model.log_scale_aggr.exp(), model.log_scale_comp.exp()
    la, lc = 0.0, 0.0
    for i in range(B):
        for k in range(K):
            if not b.local_mask[i, k]:
                continue
            v, bg, _ = naive_aggr(model.aggr, b.local[i, k], b.image_global[i], b.patches[i])
            la = la - F.logsigmoid(s_a * F.cosine_similarity(v, b.local[i, k], dim=0) + model.bias_aggr)
            if with_comp:
                h = naive_comp(model.comp, v, bg, b.ctx_tokens[i, k], b.ctx_mask[i, k])
                lc = lc - F.logsigmoid(s_c * h @ b.image_global[i] + model.bias_comp)
        for j in plan.columns.tolist():
            if j == i:
                continue
            kp = int(plan.neg_k[j])
            c = b.local[j, kp]
            v, bg, _ = naive_aggr(model.aggr, c, b.image_global[i], b.patches[i])
            la = la - F.logsigmoid(-(s_a * F.cosine_similarity(v, c, dim=0) + model.bias_aggr))
            if with_comp:
                h = naive_comp(model.comp, v, bg, b.ctx_tokens[j, kp], b.ctx_mask[j, kp])
                lc = lc - F.logsigmoid(-(s_c * h @ b.image_global[j] + model.bias_comp))
    out = {"aggr": la / B}
    if with_comp:
        out["comp"] = lc / B
    return out


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
    total_slow = sum(slow.values())
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
