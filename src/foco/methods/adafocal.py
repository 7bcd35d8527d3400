"""AdaFocal (OACIR, seeds/adafocal-oacir.txt) on FoCo's composed-query encoder: F_Aggr + F_Comp, trained
supervised (`foco.train.adafocal`), with the box's attention bias on F_Aggr from one of three variants:

* "caam" (AdaFocal): CAAM predicts beta per query from the probes and the query's context (`foco.model.caam`);
* "none" (the paper's baseline, "w/o CAAM"): the same model, the box ignored;
* "fixed": foco's fixed beta (`foco.model.box`), `AdaFocalConfig.fixed_beta` inside the box (chosen on val by
  the caller).

A checkpoint folder holds model.safetensors and adafocal.json (the config, the variant, the features' provenance).
The method "adafocal" reads the box from `QueryBatch.box_mask` (B, P) bool; a batch without one is composed as if
no query had a box (zero bias).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from ..backbones.base import ImageFeatures, TextFeatures
from ..model.caam import CAAM, CAAMConfig
from ..model.encoder import ComposedQuery, ComposedQueryEncoder, FoCoConfig, config_from_dict
from .base import MethodOption, MethodOptions, QueryBatch, QueryMethod, require

VARIANTS = ("caam", "none", "fixed")
WEIGHTS, RECORD = "model.safetensors", "adafocal.json"
FIX = "retrain it with `foco adafocal train`"


@dataclass
class AdaFocalConfig:
    variant: str = "caam"  # VARIANTS
    foco: FoCoConfig = field(default_factory=FoCoConfig)  # the composed-query encoder's shape
    caam: CAAMConfig = field(default_factory=CAAMConfig)  # read for "caam" only
    fixed_beta: float = 0.0  # read for "fixed" only

    def check(self) -> "AdaFocalConfig":
        if self.variant not in VARIANTS:
            raise ValueError(f"AdaFocal variant {self.variant!r}: choose one of {', '.join(VARIANTS)}")
        if self.variant == "caam" and self.caam.dim != self.foco.dim:
            raise ValueError(f"CAAM dim {self.caam.dim} differs from the encoder's {self.foco.dim}")
        return self

    @staticmethod
    def from_dict(raw: dict) -> "AdaFocalConfig":
        return AdaFocalConfig(variant=raw["variant"], foco=config_from_dict(raw["foco"]),
                              caam=CAAMConfig(**raw["caam"]), fixed_beta=float(raw["fixed_beta"])).check()


class AdaFocalModel(nn.Module):
    """ComposedQueryEncoder (F_Aggr + F_Comp, as FoCo) + CAAM for the "caam" variant (module docstring)."""

    def __init__(self, cfg: AdaFocalConfig):
        super().__init__()
        self.cfg = cfg.check()
        self.encoder = ComposedQueryEncoder(cfg.foco)
        self.caam = CAAM(cfg.caam) if cfg.variant == "caam" else None

    def attention_bias(self, reference: ImageFeatures, modification: TextFeatures,
                       box_mask: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(bias (B, P) or None, beta (B, 1) / (B, P) or None) for F_Aggr: None where the variant adds nothing."""
        if self.cfg.variant == "none" or box_mask is None:
            return None, None
        box = box_mask.to(device=reference.patches.device, dtype=torch.bool)  # (B, P)
        if self.cfg.variant == "fixed":
            bias = self.cfg.fixed_beta * box.to(reference.patches.dtype)  # (B, P)
            return bias, None
        mod = self.caam(reference.global_, reference.patches, modification.tokens, modification.mask, box)
        return mod.bias, mod.beta

    def forward(self, reference: ImageFeatures, modification: TextFeatures,
                box_mask: torch.Tensor | None = None) -> ComposedQuery:
        """B references (B, D), (B, P, D), B modification texts and their boxes (B, P) bool -> B composed queries."""
        bias, _ = self.attention_bias(reference, modification, box_mask)
        return self.encoder.encode(reference, modification, attn_bias=bias)

    def save(self, path: str | Path, meta: dict | None = None) -> None:
        """model.safetensors and adafocal.json; `meta` (the provenance, the training settings) goes beside the
        config."""
        from safetensors.torch import save as st_save
        from ..utils.io import atomic_write_bytes, atomic_write_text
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        data = st_save({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()})
        atomic_write_bytes(path / WEIGHTS, data)
        record = {"model": "adafocal", "variant": self.cfg.variant, "config": asdict(self.cfg),
                  "weights_sha256": hashlib.sha256(data).hexdigest(), **(meta or {})}
        atomic_write_text(path / RECORD, json.dumps(record, indent=2) + "\n")

    @staticmethod
    def load(path: str | Path) -> "AdaFocalModel":
        from ..records import built
        from ..utils.io import load_tensors, load_weights, read_json, sha256_file
        path = Path(path)
        meta = read_json(path / RECORD)
        if not isinstance(meta, dict) or meta.get("model") != "adafocal" or "config" not in meta:
            raise ValueError(f"{path / RECORD} is not an AdaFocal checkpoint record; {FIX}")
        model = built(path / RECORD, lambda: AdaFocalModel(AdaFocalConfig.from_dict(meta["config"])))
        tensors = load_tensors(path / WEIGHTS, FIX)
        if meta.get("weights_sha256") and sha256_file(path / WEIGHTS) != meta["weights_sha256"]:
            raise ValueError(f"{path / WEIGHTS} does not match the weights_sha256 in {path / RECORD}; {FIX}")
        load_weights(model, tensors, path / WEIGHTS, FIX)
        return model.eval()


CHECKPOINT = MethodOption("adafocal", "--adafocal", "an AdaFocal checkpoint folder of `foco adafocal train`",
                          parse=Path, record=RECORD)


class AdaFocalMethod(QueryMethod):
    """A trained AdaFocal checkpoint (any variant). Reads the reference's patches and `QueryBatch.box_mask`."""

    reads_patches = True
    reads_box = True
    options = (CHECKPOINT,)

    def __init__(self, checkpoint: str | Path | AdaFocalModel):
        """`checkpoint`: a checkpoint folder, or a model in memory (e.g. one being trained)."""
        model = checkpoint if isinstance(checkpoint, AdaFocalModel) else AdaFocalModel.load(checkpoint)
        self.model = model.eval()

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "AdaFocalMethod":
        return cls(require(opts, CHECKPOINT, "adafocal"))

    def modules(self) -> list[torch.nn.Module]:
        return [self.model]

    @torch.inference_mode()
    def encode(self, batch: QueryBatch) -> ComposedQuery:
        if batch.anchor is not None or batch.attn_bias is not None:
            raise ValueError("AdaFocal takes its box as QueryBatch.box_mask, not an anchor or an attention bias")
        return self.model(batch.reference, batch.modification, batch.box_mask)
