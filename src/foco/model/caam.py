"""CAAM, AdaFocal's Context-Aware Attention Modulator (OACIR; seeds/adafocal-oacir.txt, Fig. 4, Tables 3, 11-13).

The fixed box anchoring of `foco.model.box` adds one beta, chosen on val, to F_Aggr's attention logits inside the
box. CAAM predicts beta per query from its context, balancing the anchored instance against the rest:

    S = [probes (K); v_g; box(V_p); rest(V_p); X]         K probe tokens, the reference's global, the mean patch
                                                           inside the box (the instance) and outside it (its
                                                           context), the modification's tokens X (padding masked);
                                                           each with a learned type embedding
    S <- L self-attention layers (pre-norm transformer encoder layers) over S
    beta = softplus(CRM(S[:K]))                           the context reasoning module reads the K probe outputs
    bias_p = beta * [p in box]                            what `FAggr(attn_bias=...)` adds to its logits

The patches enter pooled, inside and outside the box, not one token each: the sequence stays K + 3 + L long
whatever the patch grid (a ViT-L/14's 256 patches would make it ~10x longer and the layers ~10x dearer), and the
patch-level attention is F_Aggr's own, which beta then steers.

CRM: "mlp" (the paper's): a two-layer MLP over the K probe outputs concatenated; "pool" (Table 3's ablation): the
probes' mean, then one linear layer. Probes: learnable parameters, or frozen (Table 3): fixed random buffers
drawn from `CAAMConfig.seed`, never trained. beta is kept positive (softplus): the box marks the instance to
*preserve*, so the attention inside it is intensified; the last layer starts near beta = `init_beta`.

beta "scalar" (the paper's): beta (B, 1), the same on every patch in the box. "vector" (Table 11's ablation): one
beta per *patch*, beta (B, P), beta_p = softplus(w . (CRM(probes) ⊙ W V_p) + b) from the CRM's summary and patch
p's own (projected) feature. A vector over patches keeps F_Aggr's (B, P) bias and its call unchanged (a vector over
F_Aggr's heads would need a per-head bias there) and works for any number of patches. Outside the box the bias is
0 for both, and a row without a box (an all-False mask) gets no bias at all.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

CRMS = ("mlp", "pool")
BETAS = ("scalar", "vector")


@dataclass
class CAAMConfig:
    dim: int = 256  # D, the backbone's joint-space width (set from the features)
    probes: int = 8  # K probe tokens (Table 13)
    layers: int = 2  # self-attention layers (Table 12)
    heads: int = 8
    mlp_ratio: float = 2.0  # the layers' feed-forward width and the CRM MLP's hidden width, x D
    crm: str = "mlp"  # "mlp" (the paper's) or "pool" (average pooling, Table 3)
    learnable_probes: bool = True  # False: frozen random probes (Table 3)
    beta: str = "scalar"  # "scalar" (B, 1) or "vector" (B, P), one per patch (Table 11)
    init_beta: float = 1.0  # beta at the start (the last layer's bias; its weights start small)
    seed: int = 0  # draws the probes (the frozen ones stay these)

    def check(self) -> "CAAMConfig":
        if self.crm not in CRMS:
            raise ValueError(f"CAAM crm {self.crm!r}: choose one of {', '.join(CRMS)}")
        if self.beta not in BETAS:
            raise ValueError(f"CAAM beta {self.beta!r}: choose one of {', '.join(BETAS)}")
        if self.probes < 1 or self.layers < 0:
            raise ValueError(f"CAAM needs at least one probe and no negative layer count ({self.probes}, "
                             f"{self.layers})")
        if self.dim % self.heads:
            raise ValueError(f"CAAM dim {self.dim} is not divisible by heads {self.heads}")
        if self.init_beta <= 0:
            raise ValueError(f"CAAM init_beta must be positive (softplus output), got {self.init_beta}")
        return self


@dataclass
class Modulation:
    beta: torch.Tensor  # (B, 1) scalar, or (B, P) vector (one per patch)
    bias: torch.Tensor  # (B, P) additive F_Aggr attention logits: beta inside the box, 0 outside and without one


def inverse_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))


class CAAM(nn.Module):
    """Probes + context -> beta and F_Aggr's attention bias (module docstring)."""

    def __init__(self, cfg: CAAMConfig):
        super().__init__()
        self.cfg = cfg.check()
        D, K = cfg.dim, cfg.probes
        g = torch.Generator().manual_seed(cfg.seed)
        probes = 0.02 * torch.randn(K, D, generator=g)  # (K, D)
        if cfg.learnable_probes:
            self.probes = nn.Parameter(probes)
        else:
            self.register_buffer("probes", probes)  # frozen: saved with the weights, never trained
        self.types = nn.Parameter(0.02 * torch.randn(5, D))  # probe (learnable probes only), global, context patches, box patches, text
        hidden = int(D * cfg.mlp_ratio)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(D, cfg.heads, hidden, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=True) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(D)
        if cfg.crm == "mlp":
            self.crm = nn.Sequential(nn.Linear(K * D, hidden), nn.GELU(), nn.Linear(hidden, D))
        else:
            self.crm = nn.Linear(D, D)
        self.head = nn.Linear(D, 1)  # summary (or summary ⊙ projected patch) -> raw beta
        self.patch_proj = nn.Linear(D, D) if cfg.beta == "vector" else None
        nn.init.normal_(self.head.weight, std=0.01)
        nn.init.constant_(self.head.bias, inverse_softplus(cfg.init_beta))

    def forward(self, ref_global: torch.Tensor, patches: torch.Tensor, text_tokens: torch.Tensor,
                text_mask: torch.Tensor, box_mask: torch.Tensor) -> Modulation:
        """
        Args:
            ref_global: (B, D) the reference's global feature v_g.
            patches: (B, P, D) its patch features V_p.
            text_tokens: (B, L, D) the modification's token features X; text_mask (B, L) bool, True on real tokens.
            box_mask: (B, P) bool, True on the patches inside the box (all False: no box).
        Returns:
            `Modulation`: beta (B, 1) or (B, P), bias (B, P) in the patches' dtype, on the inputs' device.
        """
        B, P, D = patches.shape
        K = self.cfg.probes
        dtype = patches.dtype
        box = box_mask.to(device=patches.device, dtype=torch.bool)  # (B, P)
        types = self.types.to(dtype)  # (5, D)
        probes = self.probes.to(dtype)  # (K, D)
        if self.cfg.learnable_probes:  # frozen probes stay exactly as drawn: no learned type shift either
            probes = probes + types[0]
        probes = probes[None].expand(B, K, D)  # (B, K, D)
        glob = (ref_global.to(dtype) + types[1])[:, None, :]  # (B, 1, D)
        inside = box.to(dtype)[..., None]  # (B, P, 1)
        n_in = inside.sum(1).clamp_min(1)  # (B, 1)
        in_box = (patches * inside).sum(1) / n_in + types[3]  # (B, D) the instance's mean patch
        rest = (patches * (1 - inside)).sum(1) / (P - inside.sum(1)).clamp_min(1) + types[2]  # (B, D) its context
        text = text_tokens.to(dtype) + types[4]  # (B, L, D)
        seq = torch.cat([probes, glob, in_box[:, None], rest[:, None], text], dim=1)  # (B, K + 3 + L, D)
        keep = torch.cat([torch.ones(B, K + 3, dtype=torch.bool, device=patches.device),
                          text_mask.to(device=patches.device, dtype=torch.bool)], dim=1)  # (B, K + 3 + L)
        pad = ~keep  # (B, S): True on the padded text positions, which no token attends to
        for layer in self.layers:
            seq = layer(seq, src_key_padding_mask=pad)  # (B, S, D)
        seq = self.norm(seq)  # (B, S, D)
        out = seq[:, :K]  # (B, K, D) the probes
        summary = self.crm(out.flatten(1) if self.cfg.crm == "mlp" else out.mean(1))  # (B, D)
        if self.cfg.beta == "scalar":
            beta = F.softplus(self.head(summary))  # (B, 1)
        else:
            patch_out = self.patch_proj(patches.to(dtype))  # (B, P, D)
            beta = F.softplus(self.head(summary[:, None, :] * patch_out)[..., 0])  # (B, P)
        bias = beta * box.to(beta.dtype)  # (B, P): beta in the box, 0 outside and in rows without a box
        return Modulation(beta, bias)


def apply_bias_naive(beta: torch.Tensor, box_mask: torch.Tensor) -> torch.Tensor:
    """The slow, obvious twin of CAAM's bias (tests): row by row, patch by patch, beta (B, 1) or (B, P) where the
    box is, 0 elsewhere."""
    B, P = box_mask.shape
    out = torch.zeros(B, P, dtype=beta.dtype, device=beta.device)  # (B, P)
    for b in range(B):
        for p in range(P):
            if bool(box_mask[b, p]):
                out[b, p] = beta[b, 0] if beta.shape[1] == 1 else beta[b, p]
    return out
