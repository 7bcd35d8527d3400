"""F_Aggr, text-anchored visual aggregation (paper §3.2, eq. 1).

q = MLP(c ⊙ v_g) attends over the patch features V_p with one 8-head cross-attention layer followed by a
feed-forward projection; the result is the localized feature v_loc. The background feature aggregates the patches
with the *inverse* of the attention map: with α_p the head-averaged attention on patch p (Σ_p α_p = 1),

    w_p = (1 - α_p) / Σ_p' (1 - α_p') ,    v̄ = Σ_p w_p V_p,

i.e. the normalised complement of the attention, so that unattended patches carry the background.

Ablation switches (paper Table 4, each named after what it does; the defaults are the paper's):
* `query`: "text-image" (q = MLP(c ⊙ v_g)); "learned" (4a: a learned query token, the same for every text and
  image: plain cross-attention); "text" (q = MLP(c), without the global image's context: the paper's stated
  reason for 4a's drop).
* `attention`: "cross-attention" (the multi-head layer with query/key/value/output projections); "dot-product"
  (4b: one parameter-free head, softmax(LN(q) . LN(V_p) / sqrt(D)) over the raw patches, added to the query).

Layout: images are the batch axis B and each image is queried by T texts, so one call computes positives
(T = K local captions of that image), the cross-instance grid (T = B texts, one per other image) or inference (T = 1).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn


AGGR_QUERIES = ("text-image", "learned", "text")
AGGR_ATTENTIONS = ("cross-attention", "dot-product")


class FAggr(nn.Module):
    """Args:
        dim: D, the backbone's joint-space width.
        heads: attention heads (8 in the paper).
        mlp_ratio: hidden width of the query MLP and the feed-forward projection, as a multiple of D.
        query: how the query is formed (module docstring; "text-image" is the paper's).
        attention: "cross-attention" (the paper's) or "dot-product" (ablation 4b).
    """

    def __init__(self, dim: int, heads: int = 8, mlp_ratio: float = 2.0, query: str = "text-image",
                 attention: str = "cross-attention"):
        super().__init__()
        if query not in AGGR_QUERIES:
            raise ValueError(f"F_Aggr query {query!r}: choose one of {', '.join(AGGR_QUERIES)}")
        if attention not in AGGR_ATTENTIONS:
            raise ValueError(f"F_Aggr attention {attention!r}: choose one of {', '.join(AGGR_ATTENTIONS)}")
        if attention == "cross-attention" and dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        hidden = int(dim * mlp_ratio)
        self.query, self.dot = query, attention == "dot-product"
        self.heads = 1 if self.dot else heads
        if query == "learned":
            self.query_token = nn.Parameter(0.02 * torch.randn(dim))
        else:
            self.query_mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.norm_q, self.norm_kv = nn.LayerNorm(dim), nn.LayerNorm(dim)
        if not self.dot:
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(dim, dim) for _ in range(4))
        self.ffn = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def keys_values(self, patches: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, P, D) patches -> keys and values (B, h, P, D/h), computed once per image (dot-product: h = 1, the
        normalised patches and the patches themselves)."""
        B, P, D = patches.shape
        x = self.norm_kv(patches)
        if self.dot:
            return x[:, None], patches[:, None]  # (B, 1, P, D) each
        k = self.k_proj(x).view(B, P, self.heads, D // self.heads).transpose(1, 2)  # (B, h, P, D/h)
        v = self.v_proj(x).view(B, P, self.heads, D // self.heads).transpose(1, 2)  # (B, h, P, D/h)
        return k, v

    def queries(self, text: torch.Tensor, image_global: torch.Tensor) -> torch.Tensor:
        """The queries (B, T, D) of T texts (B, T, D) in B images (B, D)."""
        if self.query == "learned":
            return self.query_token.to(text.dtype).expand_as(text)
        if self.query == "text":
            return self.query_mlp(text)
        return self.query_mlp(text * image_global[:, None, :])

    def forward(self, text: torch.Tensor, image_global: torch.Tensor, patches: torch.Tensor,
                kv: tuple[torch.Tensor, torch.Tensor] | None = None, attn_bias: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Localizes T texts in each of B images.

        Args:
            text: (B, T, D) anchor text features c (an expanded view is fine).
            image_global: (B, D) v_g.
            patches: (B, P, D) V_p.
            kv: precomputed `keys_values(patches)`.
            attn_bias: optional (B, P) additive bias on the attention logits (box anchoring).

        Returns:
            v_loc (B, T, D), background (B, T, D) and the head-averaged attention (B, T, P).
        """
        B, T, D = text.shape
        h = self.heads
        k, v = kv if kv is not None else self.keys_values(patches)
        query = self.queries(text, image_global)  # (B, T, D)
        if self.dot:
            q = self.norm_q(query)[:, None]  # (B, 1, T, D)
        else:
            q = self.q_proj(self.norm_q(query)).view(B, T, h, D // h).transpose(1, 2)  # (B, h, T, D/h)
        logits = q @ k.transpose(-1, -2) / math.sqrt(D // h)  # (B, h, T, P)
        if attn_bias is not None:
            logits = logits + attn_bias[:, None, None, :]
        attn = logits.softmax(-1)  # (B, h, T, P)
        out = (attn @ v).transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        x = query + (out if self.dot else self.o_proj(out))  # (B, T, D)
        v_loc = x + self.ffn(x)  # (B, T, D)
        alpha = attn.mean(1)  # (B, T, P), sums to 1 over P
        inv = 1.0 - alpha
        inv = inv / inv.sum(-1, keepdim=True).clamp_min(1e-6)  # (B, T, P)
        background = inv @ patches  # (B, T, D)
        return v_loc, background, alpha
