"""F_Comp, context-conditioned semantic completion (paper §3.2).

S = [f_t(X); f_v(v_loc); f_v(v̄)] with a padding mask on X; a query token initialised with v_loc passes through two
transformer blocks (8-head attention over S, a feed-forward layer, residual + norm after each). The output h lives
in the backbone's joint space and is L2-normalised.

Layout: contexts are the batch axis T and each context serves N queries, so that a context's tokens are projected
once however many images use it. Positives flatten (image, k) into T with N = 1; the cross-instance grid has T = B
contexts (one per other image j) each used by N = B images; inference has T = B queries and N = 1.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CompBlock(nn.Module):
    """Cross-attention from the query token to S, then a feed-forward layer; post-norm residuals."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float, ffn: bool = True):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(dim, dim) for _ in range(4))
        self.norm1 = nn.LayerNorm(dim)
        if ffn:  # False: the attention layer alone (ablation 5a)
            hidden = int(dim * mlp_ratio)
            self.norm2 = nn.LayerNorm(dim)
            self.ffn = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, query: torch.Tensor, ctx: torch.Tensor, ctx_mask: torch.Tensor, vis: torch.Tensor
                ) -> torch.Tensor:
        """query (T, N, D); ctx (T, L, D) text part of S shared by the N queries; ctx_mask (T, L) bool;
        vis (T, N, V, D) visual part of S, one per query. Returns the updated query (T, N, D)."""
        T, N, D = query.shape
        L, V, h, dh = ctx.shape[1], vis.shape[2], self.heads, D // self.heads
        q = self.q_proj(query).view(T, N, h, dh).transpose(1, 2)  # (T, h, N, dh)
        kt = self.k_proj(ctx).view(T, L, h, dh).transpose(1, 2)  # (T, h, L, dh)
        vt = self.v_proj(ctx).view(T, L, h, dh).transpose(1, 2)  # (T, h, L, dh)
        kv_ = self.k_proj(vis).view(T, N, V, h, dh).permute(0, 3, 1, 2, 4)  # (T, h, N, V, dh)
        vv_ = self.v_proj(vis).view(T, N, V, h, dh).permute(0, 3, 1, 2, 4)  # (T, h, N, V, dh)
        scale = 1.0 / math.sqrt(dh)
        s_text = q @ kt.transpose(-1, -2) * scale  # (T, h, N, L)
        s_text = s_text.masked_fill(~ctx_mask[:, None, None, :], float("-inf"))
        s_vis = (q[:, :, :, None, :] * kv_).sum(-1) * scale  # (T, h, N, V)
        attn = torch.cat([s_text, s_vis], -1).softmax(-1)  # (T, h, N, L + V)
        out = attn[..., :L] @ vt + (attn[..., L:, None] * vv_).sum(-2)  # (T, h, N, dh)
        out = out.transpose(1, 2).reshape(T, N, D)  # (T, N, D)
        x = self.norm1(query + self.o_proj(out))
        if not hasattr(self, "ffn"):
            return x  # (T, N, D)
        return self.norm2(x + self.ffn(x))  # (T, N, D)


COMP_LAYERS = ("transformer", "attention", "linear")  # "linear": `LinearFusion`, ablations 1a and 1b


def mapping_network(dim: int, mlp_ratio: float) -> nn.Sequential:
    """A modality-specific mapping network (f_t, f_v): a two-layer MLP of hidden width `mlp_ratio` x D then a
    LayerNorm (the paper-size shape); `mlp_ratio` 0: one linear layer then a LayerNorm (the compact shape)."""
    if mlp_ratio <= 0:
        return nn.Sequential(nn.Linear(dim, dim), nn.LayerNorm(dim))
    hidden = int(dim * mlp_ratio)
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim), nn.LayerNorm(dim))


class FComp(nn.Module):
    """Args:
        dim: D, the joint-space width.
        heads: attention heads per block (8 in the paper).
        depth: transformer blocks (2 in the paper).
        mlp_ratio: feed-forward width as a multiple of D.
        map_mlp_ratio: hidden width of f_t and f_v as a multiple of D (`mapping_network`; 0: one linear layer).
        use_background: put v̄ into S (ablation 5b removes it).
        background_dropout: NOT in the paper (issue 54's lever): in training, each query's v̄ is zeroed with this
            probability, so that the context must carry what the background would; 0 (the paper): never.
        anchor_init: initialise the query with v_loc (True, paper) or a learned token (ablation 5c).
        layers: "transformer" (the paper's `depth` blocks) or "attention" (ablation 5a, the transformer blocks
            removed: one cross-attention layer from the query to S, with no feed-forward layer and no stacking).
    """

    def __init__(self, dim: int, heads: int = 8, depth: int = 2, mlp_ratio: float = 4.0,
                 use_background: bool = True, anchor_init: bool = True, layers: str = "transformer",
                 map_mlp_ratio: float = 0.0, background_dropout: float = 0.0):
        super().__init__()
        if not 0.0 <= background_dropout < 1.0:
            raise ValueError(f"background_dropout must be in [0, 1), got {background_dropout}")
        self.background_dropout = background_dropout
        if layers not in COMP_LAYERS:
            raise ValueError(f"F_Comp layers {layers!r}: choose one of {', '.join(COMP_LAYERS)}")
        self.f_t = mapping_network(dim, map_mlp_ratio)
        self.f_v = mapping_network(dim, map_mlp_ratio)
        if layers == "attention":
            self.blocks = nn.ModuleList([CompBlock(dim, heads, mlp_ratio, ffn=False)])
        else:
            self.blocks = nn.ModuleList(CompBlock(dim, heads, mlp_ratio) for _ in range(depth))
        self.query_token = nn.Parameter(torch.zeros(dim))
        self.out = nn.Linear(dim, dim)
        self.use_background, self.anchor_init = use_background, anchor_init

    def forward(self, v_loc: torch.Tensor, background: torch.Tensor, ctx_tokens: torch.Tensor,
                ctx_mask: torch.Tensor) -> torch.Tensor:
        """v_loc, background (T, N, D); ctx_tokens (T, L, D); ctx_mask (T, L). Returns h (T, N, D), normalised."""
        ctx = self.f_t(ctx_tokens)  # (T, L, D), projected once per context
        if self.training and self.background_dropout > 0:  # NOT in the paper (issue 54's lever): per query
            keep = torch.rand(background.shape[:2], device=background.device) >= self.background_dropout  # (T, N)
            background = background * keep[..., None].to(background.dtype)
        parts = [v_loc, background] if self.use_background else [v_loc]
        vis = self.f_v(torch.stack(parts, 2))  # (T, N, V, D)
        query = v_loc + self.query_token if self.anchor_init else self.query_token.expand_as(v_loc)  # (T, N, D)
        for block in self.blocks:
            query = block(query, ctx, ctx_mask, vis)
        return F.normalize(self.out(query), dim=-1)  # (T, N, D)


class LinearFusion(nn.Module):
    """F_Comp replaced by linear feature fusion (paper Table 4, rows 1a and 1b; the paper follows its ref. [3],
    Pic2Word, whose "Image + Text" baseline adds the normalised image and text features): h = norm(W_v norm(v_loc)
    + W_t norm(x)), x the context's masked token mean, W_v and W_t learned D x D maps starting at the identity (so
    training starts from Pic2Word's sum). The background takes no part: the fusion has two inputs, as the sum has.
    The same call as `FComp`."""

    def __init__(self, dim: int):
        super().__init__()
        self.w_v, self.w_t = nn.Linear(dim, dim), nn.Linear(dim, dim)
        for w in (self.w_v, self.w_t):
            nn.init.eye_(w.weight)
            nn.init.zeros_(w.bias)

    def forward(self, v_loc: torch.Tensor, background: torch.Tensor, ctx_tokens: torch.Tensor,
                ctx_mask: torch.Tensor) -> torch.Tensor:
        """v_loc, background (T, N, D); ctx_tokens (T, L, D); ctx_mask (T, L). Returns h (T, N, D), normalised."""
        m = ctx_mask.to(ctx_tokens.dtype)[..., None]  # (T, L, 1)
        x = (ctx_tokens * m).sum(1) / m.sum(1).clamp_min(1.0)  # (T, D)
        t = self.w_t(F.normalize(x, dim=-1))[:, None, :]  # (T, 1, D)
        return F.normalize(self.w_v(F.normalize(v_loc, dim=-1)) + t, dim=-1)  # (T, N, D)
