"""The composed-query encoder: reference image + modification text -> one normalised query vector.

The same object serves training (the losses call its `aggr` and `comp` modules on batched grids), evaluation and
retrieval (through `encode`). At inference the modification text plays both the anchor c and the context X (§3.4).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn

from ..backbones.base import ImageFeatures, TextFeatures
from .aggr import FOCUS, FAggr, FixedFocus
from .comp import FComp, LinearFusion


@dataclass
class FoCoConfig:
    """The module shapes default to the paper's size (`SHAPES["paper"]`: 38.4M trainable parameters at D = 768,
    the paper's "38M"; docs/architecture.md gives the readings of its words and their counts). `shape("compact")`
    is the shape foco used before (23.0M at D = 768); a checkpoint whose config predates the shape fields loads as
    compact (`FoCoConfig.from_dict`)."""
    dim: int = 256  # D, the backbone's joint-space width (set from the backbone)
    heads: int = 8  # attention heads in F_Aggr and F_Comp
    comp_depth: int = 2  # transformer blocks in F_Comp
    aggr_mlp_ratio: float = 2.0  # hidden width of F_Aggr's query MLP(c ⊙ v_g), x D
    comp_mlp_ratio: float = 4.0  # feed-forward width in each F_Comp block, x D
    aggr_block_ffn_ratio: float = 4.0  # the feed-forward layer of F_Aggr's cross-attention block, x D; 0: none
    aggr_ffn_ratio: float = 4.0  # F_Aggr's feed-forward projection after the block, x D
    map_mlp_ratio: float = 4.0  # f_t and f_v: two-layer MLPs of this hidden width, x D; 0: one linear layer
    use_background: bool = True  # put the inverse-attention background into F_Comp's sequence (False: 5b)
    anchor_init: bool = True  # F_Comp's query starts from v_loc (False: a learned token, 5c)
    aggr_query: str = "text-image"  # F_Aggr's query MLP(c ⊙ v_g); "learned" (4a), "text" (MLP(c)): model.aggr
    aggr_attention: str = "cross-attention"  # F_Aggr's multi-head layer; "dot-product" (4b)
    background: str = "complement"  # how F_Aggr's inverse attention weighs the patches for v̄: model.aggr
    comp_layers: str = "transformer"  # F_Comp's comp_depth blocks; "attention" (5a: one attention layer);
    #                                   "linear" (1a, 1b: F_Comp replaced by linear feature fusion, model.comp)
    focus: str = "attention"  # F_Aggr; without it "global" (1a: v_loc = v_g) or "cam" (1c: CAM masking), model.aggr
    init_temperature: float = 0.1  # tau at the start; learnable
    learn_bias: bool = False  # a learnable logit bias in the sigmoid loss (off = paper-exact)
    init_bias: float = -10.0  # the bias's starting value when learn_bias is on (SigLIP's choice)
    background_dropout: float = 0.0  # NOT in the paper (issue 54's lever): F_Comp's v̄ zeroed in training (model.comp)

    def __post_init__(self):  # the float fields hold floats, as foco.json records them (an int there is refused)
        for name in ("aggr_mlp_ratio", "comp_mlp_ratio", "aggr_block_ffn_ratio", "aggr_ffn_ratio", "map_mlp_ratio",
                     "init_temperature", "init_bias", "background_dropout"):
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(self, name, float(value))


# Named module shapes: the fields each sets (everything else stays as given).
SHAPES: dict[str, dict[str, float]] = {
    "paper": {"aggr_mlp_ratio": 2.0, "comp_mlp_ratio": 4.0, "aggr_block_ffn_ratio": 4.0, "aggr_ffn_ratio": 4.0,
              "map_mlp_ratio": 4.0},
    "compact": {"aggr_mlp_ratio": 2.0, "comp_mlp_ratio": 4.0, "aggr_block_ffn_ratio": 0.0, "aggr_ffn_ratio": 2.0,
                "map_mlp_ratio": 0.0},
}
# What a config written before the shape fields existed meant: the compact shape, with F_Aggr's feed-forward
# projection as wide as its query MLP.
_LEGACY = ("aggr_block_ffn_ratio", "aggr_ffn_ratio", "map_mlp_ratio")


def shape_fields(name: str) -> dict[str, float]:
    """The FoCoConfig fields of a named shape ("paper", "compact")."""
    if name not in SHAPES:
        raise ValueError(f"FoCo shape {name!r}: choose one of {', '.join(SHAPES)}")
    return dict(SHAPES[name])


def config_from_dict(raw: dict) -> FoCoConfig:
    """A FoCoConfig from a checkpoint's JSON; a config that predates the shape fields is the compact shape."""
    raw = dict(raw)
    if not any(k in raw for k in _LEGACY):
        raw.update({k: v for k, v in SHAPES["compact"].items() if k in _LEGACY})
        raw["aggr_ffn_ratio"] = raw.get("aggr_mlp_ratio", 2.0)
    unknown = set(raw) - set(FoCoConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(f"FoCo config has unknown fields {sorted(unknown)}: written by a newer foco?")
    return FoCoConfig(**raw)


def shape_of(cfg: FoCoConfig) -> str | None:
    """The named shape `cfg` has, or None."""
    return next((n for n, f in SHAPES.items() if all(getattr(cfg, k) == v for k, v in f.items())), None)


@dataclass
class ComposedQuery:
    query: torch.Tensor  # (B, D) normalised h
    attention: torch.Tensor | None  # (B, P) F_Aggr's head-averaged attention on the reference's patches
    v_loc: torch.Tensor | None  # (B, D); None for methods without F_Aggr


class ComposedQueryEncoder(nn.Module):
    """F_Aggr + F_Comp and the loss temperatures/biases."""

    def __init__(self, cfg: FoCoConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.focus not in FOCUS:
            raise ValueError(f"FoCo focus {cfg.focus!r}: choose one of {', '.join(FOCUS)}")
        self.aggr = FAggr(cfg.dim, cfg.heads, cfg.aggr_mlp_ratio, cfg.aggr_query, cfg.aggr_attention,
                          cfg.background, ffn_ratio=cfg.aggr_ffn_ratio, block_ffn_ratio=cfg.aggr_block_ffn_ratio) \
            if cfg.focus == "attention" else FixedFocus(cfg.focus)
        self.comp = LinearFusion(cfg.dim) if cfg.comp_layers == "linear" else \
            FComp(cfg.dim, cfg.heads, cfg.comp_depth, cfg.comp_mlp_ratio, cfg.use_background, cfg.anchor_init,
                  cfg.comp_layers, map_mlp_ratio=cfg.map_mlp_ratio, background_dropout=cfg.background_dropout)
        t0 = torch.tensor(1.0 / cfg.init_temperature).log()
        self.log_scale_aggr = nn.Parameter(t0.clone())  # log(1/tau) for L_aggr
        self.log_scale_comp = nn.Parameter(t0.clone())  # log(1/tau) for L_comp
        b0 = cfg.init_bias if cfg.learn_bias else 0.0  # off: b = 0 for good, as in the paper
        self.bias_aggr = nn.Parameter(torch.tensor(b0), requires_grad=cfg.learn_bias)
        self.bias_comp = nn.Parameter(torch.tensor(b0), requires_grad=cfg.learn_bias)

    def encode(self, reference: ImageFeatures, modification: TextFeatures,
               attn_bias: torch.Tensor | None = None, anchor: torch.Tensor | None = None) -> ComposedQuery:
        """B reference images and B modification texts -> B composed queries (pairwise, not a grid).

        `anchor` (B, D), optional: the global feature of a separate anchor text c for F_Aggr (the paper's optional
        decomposition of T_m, §3.4); by default T_m is both the anchor and the context."""
        c = modification.global_ if anchor is None else anchor.to(modification.global_.dtype)  # (B, D)
        v_loc, background, attn = self.aggr(c[:, None, :], reference.global_,
                                            reference.patches, attn_bias=attn_bias)  # (B, 1, D), (B, 1, D), (B, 1, P)
        h = self.comp(v_loc, background, modification.tokens, modification.mask)  # (B, 1, D)
        return ComposedQuery(h[:, 0], attn[:, 0], v_loc[:, 0])

    def num_trainable(self) -> int:
        """F_Aggr's and F_Comp's parameters (the temperatures and biases are not counted)."""
        return sum(p.numel() for m in (self.aggr, self.comp) for p in m.parameters() if p.requires_grad)

    def save(self, path: str | Path, meta: dict | None = None) -> None:
        """foco.safetensors and foco.json; `meta` (e.g. {"backbone": spec}: what every consumer checks the
        checkpoint against; training records it) goes into foco.json beside the config."""
        import hashlib
        from safetensors.torch import save as st_save
        from ..utils.io import atomic_write_bytes, atomic_write_text
        path = Path(path)
        data = st_save({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()})
        atomic_write_bytes(path / "foco.safetensors", data)
        atomic_write_text(path / "foco.json", json.dumps({"model": "foco", "config": asdict(self.cfg),
                                                          "weights_sha256": hashlib.sha256(data).hexdigest(),
                                                          **(meta or {})}, indent=2))

    @staticmethod
    def load(path: str | Path) -> "ComposedQueryEncoder":
        from ..utils.io import load_tensors, load_weights
        path = Path(path)
        from ..utils.io import sha256_file
        meta = checkpoint_meta(path)
        from ..records import built
        model = built(path / "foco.json", lambda: ComposedQueryEncoder(config_from_dict(meta["config"])))
        weights = path / "foco.safetensors"
        fix = "retrain it with `foco train`, or point --checkpoint at a FoCo checkpoint folder"
        changed = meta.get("weights_sha256") and weights.is_file() and sha256_file(weights) != meta["weights_sha256"]
        tensors = load_tensors(weights, fix)  # an unreadable file says so first
        if changed:
            raise ValueError(f"{weights} does not match the weights_sha256 in {path / 'foco.json'} (changed or "
                             f"damaged since it was saved, or copied from another checkpoint); {fix}")
        load_weights(model, tensors, weights, fix)
        return model.eval()


def checkpoint_meta(path: str | Path) -> dict:
    """A FoCo checkpoint's foco.json: its config and what training recorded (e.g. the "backbone" spec)."""
    from ..records import read
    return read("foco.json", Path(path) / "foco.json")
