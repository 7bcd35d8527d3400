"""Slow, obvious per-pair twins of FoCo's optimised paths, written straight from the paper's equations.

Used by the tests (the batched code must agree with these to 1e-5) and by the training-speed benchmark. Nothing
here is used for training or serving.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .model.aggr import FAggr
from .model.comp import FComp
from .model.encoder import ComposedQueryEncoder
from .train.data import TrainBatch
from .train.losses import NegativePlan


def aggr_one(aggr: FAggr, c: torch.Tensor, vg: torch.Tensor, patches: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """F_Aggr for one image (vg (D,), patches (P, D)) and one anchor c (D,): v_loc, background, attention."""
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


def comp_one(comp: FComp, v_loc: torch.Tensor, bg: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor
             ) -> torch.Tensor:
    """F_Comp for one query: S = [f_t(X); f_v(v_loc); f_v(v̄)] built explicitly, plain softmax attention."""
    D = v_loc.shape[0]
    parts = [v_loc, bg] if comp.use_background else [v_loc]
    S = torch.cat([comp.f_t(tokens[mask]), comp.f_v(torch.stack(parts))])
    q = v_loc + comp.query_token if comp.anchor_init else comp.query_token
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


def losses_per_pair(model: ComposedQueryEncoder, b: TrainBatch, plan: NegativePlan, with_comp: bool
                    ) -> dict[str, torch.Tensor]:
    """Eqs. 2-3 with a Python loop over every positive (i, k) and every negative (i, j)."""
    B, K, _ = b.local.shape
    s_a, s_c = model.log_scale_aggr.exp().clamp(max=100), model.log_scale_comp.exp().clamp(max=100)
    la, lc = b.local.new_zeros(()), b.local.new_zeros(())
    for i in range(B):
        for k in range(K):
            if not b.local_mask[i, k]:
                continue
            v, bg, _ = aggr_one(model.aggr, b.local[i, k], b.image_global[i], b.patches[i])
            la = la - F.logsigmoid(s_a * F.cosine_similarity(v, b.local[i, k], dim=0) + model.bias_aggr)
            if with_comp:
                h = comp_one(model.comp, v, bg, b.ctx_tokens[i, k], b.ctx_mask[i, k])
                lc = lc - F.logsigmoid(s_c * h @ b.image_global[i] + model.bias_comp)
        for j in plan.columns.tolist():
            if j == i:
                continue
            kp = int(plan.neg_k[j])
            c = b.local[j, kp]
            v, bg, _ = aggr_one(model.aggr, c, b.image_global[i], b.patches[i])
            la = la - F.logsigmoid(-(s_a * F.cosine_similarity(v, c, dim=0) + model.bias_aggr))
            if with_comp:
                h = comp_one(model.comp, v, bg, b.ctx_tokens[j, kp], b.ctx_mask[j, kp])
                lc = lc - F.logsigmoid(-(s_c * h @ b.image_global[j] + model.bias_comp))
    out = {"aggr": la / B}
    if with_comp:
        out["comp"] = lc / B
    out["loss"] = out["aggr"] + out.get("comp", 0.0)
    return out
