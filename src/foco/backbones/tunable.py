"""The trainable part of a frozen backbone's text tower, for methods that compose in the text tower (PACT, TSCIR).

The backbone itself stays frozen: it encodes the gallery and the target captions. A `TunableText` is a copy of the
text tower's query path whose trainable part is tuned:

* `world` backbone: a trainable copy of its `TextHead` (the small transformer over the frozen MiniLM states);
* `hf` backbone: LoRA adapters (`peft`, extra `foco[lora]`) on a copy of the text model's attention projections.
  LoRA's B matrices start at zero, so the untuned adapter gives exactly the backbone's own text features.

`forward(texts, embeddings, placeholder)` reads texts whose `placeholder` word stands for a pseudo-token embedding
(`foco.backbones.pseudo`) and returns normalised globals (B, D), in the caller's grad mode.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F



@dataclass
class TextTuneConfig:
    kind: str = "auto"  # "world-head" | "lora" | "auto" (by backbone)
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ("q_proj", "v_proj")


class TunableText(nn.Module):
    cfg: TextTuneConfig

    def forward(self, texts: Sequence[str], embeddings: torch.Tensor, placeholder: str = "*") -> torch.Tensor:
        raise NotImplementedError

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().cpu().contiguous() for n, p in self.named_parameters() if p.requires_grad}

    def load_trainable(self, state: dict[str, torch.Tensor]) -> None:
        own = {n for n, p in self.named_parameters() if p.requires_grad}
        if set(state) != own:
            raise ValueError(f"text-tower weights do not match: missing {sorted(own - set(state))[:3]}, "
                             f"unexpected {sorted(set(state) - own)[:3]}")
        self.load_state_dict(state, strict=False)


class WorldTextHead(TunableText):
    """The world backbone's MiniLM (frozen, shared) and a trainable copy of its TextHead."""

    def __init__(self, backbone, cfg: TextTuneConfig):
        super().__init__()
        self.cfg = replace_kind(cfg, "world-head")
        self._backbone = [backbone]  # not a submodule: its weights are neither trained nor saved here
        self.head = copy.deepcopy(backbone.model.text).requires_grad_(True)

    def forward(self, texts: Sequence[str], embeddings: torch.Tensor, placeholder: str = "*") -> torch.Tensor:
        backbone = self._backbone[0]
        states, mask = backbone.minilm.forward_with_tokens(texts, embeddings.to(backbone.device), placeholder)
        global_, _ = self.head(states, mask)  # (B, D)
        return F.normalize(global_.float(), dim=-1).to(embeddings.device)  # the caller's device


class HFLoRAText(TunableText):
    """A copy of a transformers CLIP/SigLIP text model with LoRA adapters; the projection is the backbone's."""

    def __init__(self, backbone, cfg: TextTuneConfig):
        super().__init__()
        try:
            from peft import LoraConfig, inject_adapter_in_model
        except ImportError as exc:
            raise ImportError("LoRA on the hf text tower needs peft: pip install 'foco[lora]'") from exc
        self.cfg = replace_kind(cfg, "lora")
        self._backbone = [backbone]
        text = copy.deepcopy(backbone.model.text_model)
        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                          target_modules=list(cfg.lora_targets))
        self.text = inject_adapter_in_model(lora, text)
        for name, p in self.text.named_parameters():
            p.requires_grad_("lora_" in name)

    def forward(self, texts: Sequence[str], embeddings: torch.Tensor, placeholder: str = "*") -> torch.Tensor:
        return self._backbone[0].encode_texts_with_tokens(texts, embeddings, placeholder, self.text).global_


def replace_kind(cfg: TextTuneConfig, kind: str) -> TextTuneConfig:
    return TextTuneConfig(**{**asdict(cfg), "kind": kind})


def tunable_text(backbone, cfg: TextTuneConfig | None = None) -> TunableText:
    """The trainable text part for `backbone`: by `cfg.kind`, or by the backbone's family when "auto"."""
    cfg = cfg or TextTuneConfig()
    kind = cfg.kind
    if kind == "auto":
        kind = backbone.text_tuning  # the backbone's family says what can be tuned (`Backbone.text_tuning`)
    if kind == "world-head":
        if backbone.text_tuning != "world-head":
            raise ValueError("text tuning 'world-head' needs the world backbone; use 'lora' for an hf backbone")
        return WorldTextHead(backbone, cfg)
    if kind == "lora":
        if backbone.text_tuning != "lora":
            raise ValueError("text tuning 'lora' needs an hf backbone; use 'world-head' for the world backbone")
        return HFLoRAText(backbone, cfg)
    raise ValueError(f"unknown text tuning {kind!r}; choose world-head, lora or auto")
