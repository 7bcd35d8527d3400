"""F_Aggr, text-anchored visual aggregation (paper §3.2, eq. 1).

q = MLP(c ⊙ v_g) attends over the patch features V_p with "a single-layer cross-attention block followed by a
feed-forward projection"; the result is the localized feature v_loc. In the paper-size shape the block is a
transformer block (8-head cross-attention, then its own feed-forward layer, pre-norm residuals) and the projection
a second feed-forward layer; in the compact shape the block is the attention layer alone (`block_ffn_ratio` 0).
The background feature aggregates the patches with the *inverse* of the attention map: with α_p the head-averaged
attention on patch p (Σ_p α_p = 1),

    w_p = (1 - α_p) / Σ_p' (1 - α_p') ,    v̄ = Σ_p w_p V_p,

i.e. the normalised complement of the attention, so that unattended patches carry the background.

The paper's words ("aggregating visual patch features weighted by the inverse of the attention map") allow several
readings; `background` chooses one (ᾱ_p the head-averaged attention, P patches, each w normalised to sum to 1):
* "complement" (the default): w_p ∝ 1 - ᾱ_p. With Σ ᾱ = 1 this is v̄ = (P mean(V) - Σ ᾱ_p V_p) / (P - 1): the
  plain patch mean up to a 1/(P - 1) share of the attended difference, so v̄ hardly depends on where F_Aggr looked.
* "reciprocal": w_p ∝ 1 / max(ᾱ_p, RECIPROCAL_FLOOR / P). The floor (1 % of the uniform weight) bounds the
  weight of a patch the attention ignores at 100x a uniformly attended one.
* "negated-softmax": per head, the softmax of the negated attention logits, averaged over heads, w = mean_h
  softmax(-l_h): the attention of the opposite query.
* "below-uniform": w_p ∝ max(0, 1/P - ᾱ_p), the patches the attention weighs below a uniform map (the complement
  measured against the uniform level instead of 1); a uniform map (no patch below it) gives the plain mean.

Ablation switches (paper Table 4, each named after what it does; the defaults are the paper's):
* `query`: "text-image" (q = MLP(c ⊙ v_g)); "learned" (4a: a learned query token, the same for every text and
  image: plain cross-attention); "text" (q = MLP(c), without the global image's context: the paper's stated
  reason for 4a's drop).
* `attention`: "cross-attention" (the multi-head layer with query/key/value/output projections); "dot-product"
  (4b: one parameter-free head, softmax(LN(q) . LN(V_p) / sqrt(D)) over the raw patches, added to the query).

Without F_Aggr (paper Table 4, rows 1a and 1c: `FixedFocus`, no parameters, so L_aggr has nothing to train):
* "global" (1a, the naive global baseline): v_loc = v_g, the image's global feature, whatever the text; v̄ = the
  plain patch mean.
* "cam" (1c): class-activation-based patch masking. The activation of patch p for text c is the cosine between the
  patch feature and the text's global, a_p = <V_p / |V_p|, c> (a CLIP class activation map read off the dense
  patch features, as MaskCLIP does; CAM's class score map with the text as the class); min-max normalised per
  image and text, the patches at or above `CAM_THRESHOLD` are kept. v_loc = the mean of the kept patches, v̄ = the
  mean of the others (the plain patch mean when every patch is kept). The paper cites its ref. [35] for this
  strategy; the seed carries no reference list, so foco follows CAM's thresholded activation map (Zhou et al.,
  CVPR 2016) on CLIP's dense features (MaskCLIP, Zhou, Loy and Dai, ECCV 2022), docs/architecture.md.

Layout: images are the batch axis B and each image is queried by T texts, so one call computes positives
(T = K local captions of that image), the cross-instance grid (T = B texts, one per other image) or inference (T = 1).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn


AGGR_QUERIES = ("text-image", "learned", "text")
AGGR_ATTENTIONS = ("cross-attention", "dot-product")
AGGR_BACKGROUNDS = ("complement", "reciprocal", "negated-softmax", "below-uniform")
RECIPROCAL_FLOOR = 0.01  # "reciprocal": ᾱ_p is floored at 1 % of the uniform weight 1/P
FOCUS = ("attention", "global", "cam")  # F_Aggr (the paper's); no F_Aggr: 1a's global feature, 1c's CAM mask
CAM_THRESHOLD = 0.5  # "cam": patches whose min-max normalised activation is at least this are kept


def background_weights(reading: str, alpha: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """The background's weights (..., P), summing to 1, from the head-averaged attention alpha (..., P) and the
    attention logits (..., h, P) (module docstring)."""
    P = alpha.shape[-1]
    if reading == "complement":
        w = 1.0 - alpha
        return w / w.sum(-1, keepdim=True).clamp_min(1e-6)
    if reading == "reciprocal":
        w = 1.0 / alpha.clamp_min(RECIPROCAL_FLOOR / P)
        return w / w.sum(-1, keepdim=True)
    if reading == "negated-softmax":
        return (-logits).softmax(-1).mean(-2)
    if reading == "below-uniform":
        w = (1.0 / P - alpha).clamp_min(0.0)
        total = w.sum(-1, keepdim=True)
        return torch.where(total > 0, w / total.clamp_min(1e-12), torch.full_like(w, 1.0 / P))
    raise ValueError(f"F_Aggr background {reading!r}: choose one of {', '.join(AGGR_BACKGROUNDS)}")


class FAggr(nn.Module):
    """F_Aggr, the paper's focus (focus "attention").

    Args:
        dim: D, the backbone's joint-space width.
        heads: attention heads (8 in the paper).
        mlp_ratio: hidden width of the query MLP, as a multiple of D.
        ffn_ratio: hidden width of the feed-forward projection after the block (None: `mlp_ratio`).
        block_ffn_ratio: the cross-attention block's own feed-forward layer (pre-norm residual, as in a
            transformer block), as a multiple of D; 0 (the compact shape): the block is the attention layer alone.
        query: how the query is formed (module docstring; "text-image" is the paper's).
        attention: "cross-attention" (the paper's) or "dot-product" (ablation 4b).
        background: how the inverse attention weighs the patches (module docstring; "complement" is today's).
    """

    trainable = True  # L_aggr trains it

    def __init__(self, dim: int, heads: int = 8, mlp_ratio: float = 2.0, query: str = "text-image",
                 attention: str = "cross-attention", background: str = "complement",
                 ffn_ratio: float | None = None, block_ffn_ratio: float = 0.0):
        super().__init__()
        if background not in AGGR_BACKGROUNDS:
            raise ValueError(f"F_Aggr background {background!r}: choose one of {', '.join(AGGR_BACKGROUNDS)}")
        self.background = background
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
        if block_ffn_ratio > 0:
            wide = int(dim * block_ffn_ratio)
            self.block_ffn = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, wide), nn.GELU(), nn.Linear(wide, dim))
        out = int(dim * (mlp_ratio if ffn_ratio is None else ffn_ratio))
        self.ffn = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, out), nn.GELU(), nn.Linear(out, dim))

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
        if hasattr(self, "block_ffn"):
            x = x + self.block_ffn(x)  # (B, T, D), the block's own feed-forward layer
        v_loc = x + self.ffn(x)  # (B, T, D), the feed-forward projection
        alpha = attn.mean(1)  # (B, T, P), sums to 1 over P
        inv = background_weights(self.background, alpha, logits.transpose(1, 2))  # (B, T, P)
        background = inv @ patches  # (B, T, D)
        return v_loc, background, alpha


class FixedFocus(nn.Module):
    """The focus without F_Aggr (ablations 1a and 1c, module docstring): no parameters, the same call as `FAggr`.

    Args:
        focus: "global" (v_loc = v_g) or "cam" (class-activation-based patch masking). "global" reads no patch
            for v_loc, so a box (`attn_bias`) does not change it; "cam" adds the box to the activations."""

    trainable = False  # L_aggr is not computed: nothing here learns

    def __init__(self, focus: str):
        super().__init__()
        if focus not in FOCUS[1:]:
            raise ValueError(f"focus {focus!r} without F_Aggr: choose one of {', '.join(FOCUS[1:])}")
        self.focus = focus

    def keys_values(self, patches: torch.Tensor) -> None:
        return None

    def forward(self, text: torch.Tensor, image_global: torch.Tensor, patches: torch.Tensor,
                kv: None = None, attn_bias: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """text (B, T, D), image_global (B, D), patches (B, P, D) -> v_loc, background (B, T, D) and the weights
        (B, T, P) v_loc read the patches with (`attn_bias`, a box, is added to the activations before masking)."""
        B, T, D = text.shape
        P = patches.shape[1]
        mean = patches.mean(1, keepdim=True).expand(B, T, D)  # (B, T, D)
        if self.focus == "global":
            uniform = torch.full((B, T, P), 1.0 / P, dtype=patches.dtype, device=patches.device)
            return image_global[:, None, :].expand(B, T, D).to(patches.dtype), mean, uniform
        act = torch.nn.functional.normalize(patches, dim=-1) @ text.to(patches.dtype).transpose(1, 2)  # (B, P, T)
        act = act.transpose(1, 2)  # (B, T, P)
        if attn_bias is not None:
            act = act + attn_bias[:, None, :]
        lo, hi = act.amin(-1, keepdim=True), act.amax(-1, keepdim=True)
        cam = (act - lo) / (hi - lo).clamp_min(1e-6)  # (B, T, P) in [0, 1]
        keep = ((cam >= CAM_THRESHOLD) | (act == hi)).to(patches.dtype)  # (B, T, P): the top patch(es) always
        # (flat activations give cam 0 everywhere: every patch is then a top one, and none is divided by zero)
        w_loc = keep / keep.sum(-1, keepdim=True)
        rest = 1.0 - keep
        n_rest = rest.sum(-1, keepdim=True)
        w_bg = torch.where(n_rest > 0, rest / n_rest.clamp_min(1.0), torch.full_like(rest, 1.0 / P))
        return w_loc @ patches, w_bg @ patches, w_loc  # (B, T, D), (B, T, D), (B, T, P)
