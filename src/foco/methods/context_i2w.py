"""Context-I2W (Tang et al., AAAI 2024, "Context-I2W: Mapping Images to Context-dependent Words"), as its public code
runs it (Pter61/context-i2w at 5d02abc: model/model.py's IM2TEXT_OWM_Attn, src/trainer.py, src/eval_utils.py).

A mapper reads the image's tokens and a context, the text embedding of the caption (training) or the query prompt
(inference) with the pseudo word's placeholder in it, and writes ONE pseudo word:

    c' = to_c(c)                                          c (B, E) the raw text embedding of the context
    x  = W_R(x) * c'                                      x (B, 1+N, D) the image's tokens; W_R weight-normalised
    l  = MLP_l(ln_post_local(mean_4(VT(x[:, 1:]))) @ proj_local)   the Visual Target Extractor: 4 latents, 6 layers
    g  = MLP_g(ln_post(x[:, 0]) @ proj)
    s  = g + tanh(local_gate) * l                         local_gate starts at 0: the local branch is off at first

Training: the frozen text tower reads "a photo of *" with * = s, and the symmetric InfoNCE against the image's
global feature at the backbone's temperature (Pic2Word's loss). The context of a training image is its caption with
the subject's noun replaced by the placeholder (`mask_subject`; the release lacks its masking script). At query time
the context is the prompt "a photo of * , {modification}" itself (the placeholder's own embedding in it), and the
query is that prompt with * = s (eval_utils.py's CIRR prompt).

foco's image tokens are a feature cache's: the raw global (the CLS token's stand-in) and the patches, both in the
joint space (D), where the reference reads the vision tower's last-block tokens before its ln_post (vision width).
The mapper's own ln_post and proj follow either way. `experiments/context_i2w_reference.py` checks the mapper, the
text path and the loss against the reference code.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn as nn

from ..backbones.pseudo import PseudoTokenBackbone
from ..model.encoder import ComposedQuery
from ..utils.io import atomic_write_bytes, atomic_write_text
from .base import MethodOption, MethodOptions, QueryBatch, QueryMethod, require, require_backbone
from .pic2word import resolve_template, template_slots

WEIGHTS, CONFIG = "context_i2w.safetensors", "context_i2w.json"


@dataclass
class ContextI2WConfig:
    image_dim: int = 256  # D, the image tokens' width (the reference's vision_width; foco: the joint space)
    context_dim: int = 256  # the context embedding's width (the reference's transformer_width = embed_dim)
    token_dim: int = 384  # O, the text tower's token-embedding width
    middle_dim: int = 512  # --middle_dim
    n_layer: int = 2  # --n_layer
    dropout: float = 0.1
    vt_depth: int = 6  # VisualTargetExtractor's (fixed in the reference)
    vt_heads: int = 8
    vt_dim_head: int = 64
    vt_latents: int = 4
    vt_ff_mult: int = 4
    train_prompt: str = "a photo of *"  # get_text_features: "a photo of" + the token
    query_template: str = "a photo of * , {}"  # eval_utils.py's CIRR prompt, foco's placeholder
    placeholder: str = "*"


class _Attention(nn.Module):
    """ContextDependantAttention: latents attend over [media; latents] (a Perceiver resampler's attention)."""

    def __init__(self, dim: int, dim_head: int, heads: int):
        super().__init__()
        inner = dim_head * heads
        self.scale, self.heads = dim_head ** -0.5, heads
        self.norm_media, self.norm_latents = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_kv = nn.Linear(dim, inner * 2, bias=False)
        self.to_out = nn.Linear(inner, dim, bias=False)

    def forward(self, x: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """x (B, N, D) media, latents (B, n, D) -> (B, n, D)."""
        x, latents = self.norm_media(x), self.norm_latents(latents)
        q = self.to_q(latents)  # (B, n, H*d)
        k, v = self.to_kv(torch.cat([x, latents], dim=-2)).chunk(2, dim=-1)  # (B, N+n, H*d) each

        def heads(t):  # (B, L, H*d) -> (B, H, L, d)
            return t.unflatten(-1, (self.heads, -1)).transpose(1, 2)
        q, k, v = heads(q) * self.scale, heads(k), heads(v)
        sim = q @ k.transpose(-1, -2)  # (B, H, n, N+n)
        attn = (sim - sim.amax(dim=-1, keepdim=True).detach()).softmax(dim=-1)
        return self.to_out((attn @ v).transpose(1, 2).flatten(-2))  # (B, n, D)


class VisualTargetExtractor(nn.Module):
    """`vt_latents` learned latents, `vt_depth` layers of attention and feed-forward (both residual), a final norm."""

    def __init__(self, cfg: ContextI2WConfig):
        super().__init__()
        dim = cfg.image_dim
        self.latents = nn.Parameter(torch.randn(cfg.vt_latents, dim))
        self.layers = nn.ModuleList(nn.ModuleList([
            _Attention(dim, cfg.vt_dim_head, cfg.vt_heads),
            nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim * cfg.vt_ff_mult, bias=False), nn.GELU(),
                          nn.Linear(dim * cfg.vt_ff_mult, dim, bias=False))]) for _ in range(cfg.vt_depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, N, D) -> (B, n, D)."""
        latents = self.latents.expand(x.shape[0], -1, -1)
        for attn, ff in self.layers:
            latents = attn(x, latents) + latents
            latents = ff(latents) + latents
        return self.norm(latents)


def _mlp(cfg: ContextI2WConfig) -> nn.Sequential:
    dims = [cfg.token_dim] + [cfg.middle_dim] * cfg.n_layer  # the reference's first layer reads embed_dim (= O)
    return nn.Sequential(*[nn.Sequential(nn.Linear(a, b), nn.Dropout(cfg.dropout), nn.ReLU())
                           for a, b in zip(dims, dims[1:])])


class ContextI2WMapper(nn.Module):
    """IM2TEXT_OWM_Attn: (c (B, E), x (B, 1+N, D)) -> (B, O), in the reference's parameter layout (W_R's weight
    norm as torch's parametrization: `from_reference` maps the reference's weight_g / weight_v)."""

    def __init__(self, cfg: ContextI2WConfig):
        super().__init__()
        self.cfg = cfg
        D, O = cfg.image_dim, cfg.token_dim
        self.to_c = nn.Linear(cfg.context_dim, D, bias=False)
        self.W_R = nn.utils.parametrizations.weight_norm(nn.Linear(D, D, bias=False))
        self.ln_post, self.ln_post_local = nn.LayerNorm(D), nn.LayerNorm(D)
        self.proj = nn.Parameter(D ** -0.5 * torch.randn(D, O))
        self.proj_local = nn.Parameter(D ** -0.5 * torch.randn(D, O))
        self.VT_Extractor = VisualTargetExtractor(cfg)
        self.fc_out, self.layers = nn.Linear(cfg.middle_dim, O), _mlp(cfg)
        self.fc_out_local, self.layers_local = nn.Linear(cfg.middle_dim, O), _mlp(cfg)
        self.local_gate = nn.Parameter(torch.zeros(1))

    def forward(self, c: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        x = self.W_R(x) * self.to_c(c)[:, None, :]  # (B, 1+N, D): the context rotates every token
        local = self.VT_Extractor(x[:, 1:]).mean(dim=1)  # (B, D): AvgPool2d((4, 1)) over the latents
        g = self.fc_out(self.layers(self.ln_post(x[:, 0]) @ self.proj))  # (B, O)
        loc = self.fc_out_local(self.layers_local(self.ln_post_local(local) @ self.proj_local))  # (B, O)
        return g + loc * self.local_gate.tanh()

    @staticmethod
    def reference_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A reference state dict (`state_dict_img2text`, with or without DDP's `module.`) in this layout."""
        names = {"W_R.weight_g": "W_R.parametrizations.weight.original0",
                 "W_R.weight_v": "W_R.parametrizations.weight.original1"}
        out = {}
        for k, v in state.items():
            k = k[len("module."):] if k.startswith("module.") else k
            out[names.get(k, k)] = v
        return out

    def save(self, path: str | Path, meta: dict | None = None) -> None:
        from safetensors.torch import save as st_save
        path = Path(path)
        atomic_write_bytes(path / WEIGHTS, st_save({k: v.detach().cpu().contiguous()
                                                    for k, v in self.state_dict().items()}))
        atomic_write_text(path / CONFIG, json.dumps({"model": "context-i2w", "config": asdict(self.cfg),
                                                     **(meta or {})}, indent=2) + "\n")

    @staticmethod
    def load(path: str | Path) -> "ContextI2WMapper":
        from ..records import built, read
        from ..utils.io import load_tensors, load_weights
        path = Path(path)
        meta = read(CONFIG, path / CONFIG)
        if meta.get("model") != "context-i2w":
            raise ValueError(f"{path / CONFIG} is not a Context-I2W checkpoint config; train one with "
                             "`foco context-i2w train`")
        mapper = built(path / CONFIG, lambda: ContextI2WMapper(ContextI2WConfig(**meta["config"])))
        fix = "retrain it with `foco context-i2w train`"
        load_weights(mapper, load_tensors(path / WEIGHTS, fix), path / WEIGHTS, fix)
        return mapper.eval()


def image_tokens(global_: torch.Tensor, norm: torch.Tensor | None, patches: torch.Tensor | None,
                 where: str) -> torch.Tensor:
    """(B, 1+N, D): the raw global (the CLS token's stand-in) before the patches; refused by name without them."""
    if patches is None or norm is None:
        raise ValueError(f"{where}: no patches or no norms, which Context-I2W reads; extract the features again with "
                         "this foco (`foco features extract` keeps both)")
    raw = global_.float() * norm.float().to(global_.device)[:, None]  # (B, D)
    return torch.cat([raw[:, None, :], patches.float().to(global_.device)], dim=1)


def raw_text(backbone: PseudoTokenBackbone, texts: Sequence[str]) -> torch.Tensor:
    """(B, E): the raw (unnormalised) text embeddings of `texts`, the mapper's context."""
    f = backbone.encode_texts(list(texts))
    if f.norm is None:
        raise ValueError(f"backbone {backbone.spec} gives no raw text norms, which Context-I2W's context is")
    return f.global_.float() * f.norm.float()[:, None]


MAPPER = MethodOption("context_i2w", "--context-i2w", "a Context-I2W mapper folder of `foco context-i2w train`",
                      parse=Path, record="context_i2w.json")


class ContextI2WMethod(QueryMethod):
    """Composed queries: the prompt "a photo of * , {modification}" with * = the mapper's word for the reference's
    tokens in the context of that prompt."""

    needs_text_tower = True
    reads_patches = True
    options = (MAPPER,)

    def __init__(self, mapper: ContextI2WMapper, backbone: PseudoTokenBackbone | None = None):
        self.mapper = mapper.eval()
        self.backbone = backbone
        self.template = resolve_template(mapper.cfg.query_template, mapper.cfg.placeholder)

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "ContextI2WMethod":
        folder = require(opts, MAPPER, "context-i2w")
        backbone = require_backbone(opts, "context-i2w", "reads its context and its query with the text tower")
        return cls(ContextI2WMapper.load(folder), backbone)

    @property
    def reads_norm(self) -> bool:
        return True

    def modules(self) -> list[torch.nn.Module]:
        return [self.mapper]

    @torch.no_grad()
    def encode(self, batch: QueryBatch) -> ComposedQuery:
        if self.backbone is None:
            raise ValueError("ContextI2WMethod was built without a backbone; pass one (MethodOptions.backbone)")
        ref = batch.reference
        x = image_tokens(ref.global_, ref.norm, ref.patches, "the reference features")  # (B, 1+N, D)
        prompts = [self.template.format(m) for m in batch.texts]
        c = raw_text(self.backbone, prompts).to(x.device)  # (B, E), the placeholder's own embedding in it
        tokens = self.mapper(c, x)  # (B, O)
        ph = self.mapper.cfg.placeholder
        text = self.backbone.encode_texts_with_tokens(prompts, tokens, ph, keep=template_slots(self.template, ph))
        return ComposedQuery(query=text.global_, attention=None, v_loc=None)
