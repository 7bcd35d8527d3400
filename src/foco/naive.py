"""Slow, obvious per-pair twins of FoCo's optimised paths, written straight from the paper's equations.

Used by the tests (the batched code must agree with these to 1e-5) and by the training-speed benchmark. Nothing
here is used for training or serving.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .model.aggr import RECIPROCAL_FLOOR, FAggr
from .model.comp import FComp
from .model.encoder import ComposedQueryEncoder
from .train.data import TrainBatch
from .train.losses import NegativePlan


def aggr_one(aggr: FAggr, c: torch.Tensor, vg: torch.Tensor, patches: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """F_Aggr for one image (vg (D,), patches (P, D)) and one anchor c (D,): v_loc, background, attention."""
    D = c.shape[0]
    if aggr.query == "learned":
        query = aggr.query_token
    else:
        query = aggr.query_mlp(c if aggr.query == "text" else c * vg)
    x = aggr.norm_kv(patches)
    if aggr.dot:  # one head, no projections: softmax(LN(q) . LN(p) / sqrt(D)) over the raw patches
        logit = (x @ aggr.norm_q(query) / math.sqrt(D))[:, None]  # (P, 1)
        att = torch.softmax(logit, dim=0)  # (P, 1)
        xq = query + att[:, 0] @ patches
    else:
        h = aggr.heads
        dh = D // h
        q = aggr.q_proj(aggr.norm_q(query)).view(h, dh)
        k = aggr.k_proj(x).view(-1, h, dh)
        v = aggr.v_proj(x).view(-1, h, dh)
        logit = (k * q).sum(-1) / math.sqrt(dh)  # (P, h)
        att = torch.softmax(logit, dim=0)  # (P, h)
        out = (att[..., None] * v).sum(0).reshape(D)
        xq = query + aggr.o_proj(out)
    if hasattr(aggr, "block_ffn"):  # the paper-size shape: the block's own feed-forward layer
        xq = xq + aggr.block_ffn(xq)
    v_loc = xq + aggr.ffn(xq)
    alpha = att.mean(1)  # (P,)
    P = alpha.shape[0]
    if aggr.background == "complement":
        w = (1 - alpha) / (1 - alpha).sum()
    elif aggr.background == "reciprocal":
        w = torch.stack([1 / torch.maximum(a, a.new_tensor(RECIPROCAL_FLOOR / P)) for a in alpha])
        w = w / w.sum()
    elif aggr.background == "negated-softmax":  # each head's softmax of -logits, then the mean over heads
        w = torch.stack([torch.exp(-logit[:, j]) / torch.exp(-logit[:, j]).sum()
                         for j in range(logit.shape[1])], 1).mean(1)
    else:  # below-uniform
        w = torch.stack([torch.maximum(1 / P - a, torch.zeros_like(a)) for a in alpha])
        w = w / w.sum() if w.sum() > 0 else torch.full_like(alpha, 1 / P)
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
        q = blk.norm2(x + blk.ffn(x)) if hasattr(blk, "ffn") else x  # without ffn: the attention layer alone (5a)
    return F.normalize(comp.out(q), dim=-1)


def losses_per_pair(model: ComposedQueryEncoder, b: TrainBatch, plan: NegativePlan, with_comp: bool,
                    loss: str = "sigmoid", negatives: str = "cross-instance") -> dict[str, torch.Tensor]:
    """Eqs. 2-3 with a Python loop over every positive (i, k) and every negative (i, j). `loss` "infonce" scores
    each positive against its image's negatives with a softmax; `negatives` "naive" scores the negative (image i
    conditioned on image j's texts) against image i's own sampled anchor and own v_g, "naive-aggr" (2b) only the
    first, "naive-comp" (2c) only the second."""
    B, K, _ = b.local.shape
    s_a, s_c = model.log_scale_aggr.exp().clamp(max=100), model.log_scale_comp.exp().clamp(max=100)
    la, lc = b.local.new_zeros(()), b.local.new_zeros(())
    for i in range(B):
        pos_a, pos_c, neg_a, neg_c = {}, {}, [], []
        for k in range(K):
            if not b.local_mask[i, k]:
                continue
            v, bg, _ = aggr_one(model.aggr, b.local[i, k], b.image_global[i], b.patches[i])
            pos_a[k] = s_a * F.cosine_similarity(v, b.local[i, k], dim=0) + model.bias_aggr
            if with_comp:
                h = comp_one(model.comp, v, bg, b.ctx_tokens[i, k], b.ctx_mask[i, k])
                pos_c[k] = s_c * h @ b.image_global[i] + model.bias_comp
        own_anchor = b.local[i, int(plan.neg_k[i])]
        for j in plan.columns.tolist():
            if j == i:
                continue
            kp = int(plan.neg_k[j])
            c = b.local[j, kp]
            v, bg, _ = aggr_one(model.aggr, c, b.image_global[i], b.patches[i])
            against = own_anchor if negatives in ("naive", "naive-aggr") else c
            neg_a.append(s_a * F.cosine_similarity(v, against, dim=0) + model.bias_aggr)
            if with_comp:
                h = comp_one(model.comp, v, bg, b.ctx_tokens[j, kp], b.ctx_mask[j, kp])
                image = b.image_global[i] if negatives in ("naive", "naive-comp") else b.image_global[j]
                neg_c.append(s_c * h @ image + model.bias_comp)
        la = la + _per_image(pos_a, neg_a, loss)
        if with_comp:
            lc = lc + _per_image(pos_c, neg_c, loss)
    out = {"aggr": la / B}
    if with_comp:
        out["comp"] = lc / B
    out["loss"] = out["aggr"] + out.get("comp", 0.0)
    return out


def _per_image(pos: dict[int, torch.Tensor], neg: list[torch.Tensor], loss: str) -> torch.Tensor:
    """One image's loss from its positive logits and negative logits, one at a time."""
    total = torch.zeros((), dtype=next(iter(pos.values())).dtype)
    if loss == "sigmoid":
        for p in pos.values():
            total = total - F.logsigmoid(p)
        for n in neg:
            total = total - F.logsigmoid(-n)
        return total
    for p in pos.values():  # infonce: -log(e^p / (e^p + Σ_n e^n))
        denominator = torch.exp(p)
        for n in neg:
            denominator = denominator + torch.exp(n)
        total = total - (p - torch.log(denominator))
    return total
