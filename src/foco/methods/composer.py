"""Composing in the text tower: a mapper turns the reference image into a pseudo word, and a tuned text tower reads
"a photo of * that {modification}". PACT (seeds/pact-chord.txt) and TSCIR (seeds/tscir-mapping-to-composing.txt)
both query this way; they differ in the mapper and in how they are trained (`foco.train.pact`, `foco.train.tscir`).

* `Pic2WordMapper` (PACT): the reference's global feature -> one token embedding.
* `VSIMapper` (TSCIR's visual semantic injection): the same MLP on the global feature, plus a cross-attention of that
  token over the reference's patch features, so that fine-grained (local) content is injected into the pseudo word:
  s = MLP(v_g) + W_o Attn(q = MLP(v_g), k = v = W_p V_p). The seed names the module but not its form; this is the
  choice, documented here. W_o starts at zero, so an untrained VSI mapper is the Pic2Word mapper.

A checkpoint folder holds composer.json (the method, both configs, the backbone), mapper.safetensors and
text.safetensors (only the text tower's trainable part: the world TextHead copy, or the LoRA weights).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..backbones.tunable import TextTuneConfig, TunableText, tunable_text
from ..model.encoder import ComposedQuery
from ..utils.io import atomic_write_bytes, atomic_write_text
from .base import MethodOption, MethodOptions, QueryBatch, QueryMethod, require, require_backbone
from .pic2word import Pic2WordConfig, Pic2WordMapper

CONFIG, MAPPER, TEXT = "composer.json", "mapper.safetensors", "text.safetensors"


@dataclass
class VSIConfig(Pic2WordConfig):
    heads: int = 4  # heads of the injection attention
    patch_dim: int = 256  # D of the patch features (set from the features)


class VSIMapper(nn.Module):
    """(B, D) globals and (B, P, D) patches -> (B, E) pseudo tokens (module docstring)."""

    def __init__(self, cfg: VSIConfig):
        super().__init__()
        self.cfg = cfg
        self.base = Pic2WordMapper(cfg)
        self.kv = nn.Linear(cfg.patch_dim, cfg.token_dim)
        self.attn = nn.MultiheadAttention(cfg.token_dim, cfg.heads, batch_first=True)
        self.out = nn.Linear(cfg.token_dim, cfg.token_dim)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, image_global: torch.Tensor, patches: torch.Tensor | None = None) -> torch.Tensor:
        s = self.base(image_global)  # (B, E)
        if patches is None:
            raise ValueError("the VSI mapper reads the reference's patch features")
        kv = self.kv(patches.float())  # (B, P, E)
        injected, _ = self.attn(s[:, None], kv, kv, need_weights=False)  # (B, 1, E)
        return s + self.out(injected[:, 0])  # (B, E)


class _GlobalOnly(nn.Module):
    def __init__(self, mapper: Pic2WordMapper):
        super().__init__()
        self.base = mapper
        self.cfg = mapper.cfg

    def forward(self, image_global: torch.Tensor, patches: torch.Tensor | None = None) -> torch.Tensor:
        return self.base(image_global)  # (B, E)


def build_mapper(kind: str, cfg: Pic2WordConfig) -> nn.Module:
    """PACT's and TSCIR's mappers read the normalised global (their seeds say nothing of a raw input)."""
    cfg = replace(cfg, mapper_input="normalized")
    if kind == "pic2word":
        return _GlobalOnly(Pic2WordMapper(cfg))
    if kind == "vsi":
        return VSIMapper(cfg if isinstance(cfg, VSIConfig) else VSIConfig(**asdict(cfg)))
    raise ValueError(f"unknown mapper {kind!r}")


class TextComposer(nn.Module):
    """mapper + tunable text tower: (reference features, modification texts) -> (B, D) normalised queries."""

    def __init__(self, method: str, mapper_kind: str, mapper: nn.Module, text: TunableText):
        super().__init__()
        self.method, self.mapper_kind = method, mapper_kind
        self.mapper, self.text = mapper, text

    @property
    def cfg(self) -> Pic2WordConfig:
        return self.mapper.cfg

    def prompts(self, modifications: Sequence[str] | None, n: int) -> list[str]:
        if modifications is None:  # the identity prompt: the image alone
            return [self.cfg.train_prompt] * n
        return [self.cfg.query_template.format(m) for m in modifications]

    def forward(self, image_global: torch.Tensor, patches: torch.Tensor | None,
                modifications: Sequence[str] | None) -> torch.Tensor:
        tokens = self.mapper(image_global.float(), patches)  # (B, E)
        return self.text(self.prompts(modifications, tokens.shape[0]), tokens, self.cfg.placeholder)  # (B, D)

    def save(self, path: str | Path, meta: dict | None = None) -> None:
        from safetensors.torch import save as st_save
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path / MAPPER, st_save({k: v.detach().cpu().contiguous()
                                                   for k, v in self.mapper.state_dict().items()}))
        atomic_write_bytes(path / TEXT, st_save(self.text.trainable_state()))
        atomic_write_text(path / CONFIG, json.dumps({
            "model": self.method, "mapper": self.mapper_kind, "mapper_config": asdict(self.cfg),
            "text": asdict(self.text.cfg), **(meta or {})}, indent=2) + "\n")

    @staticmethod
    def load(path: str | Path, backbone, expect: str | None = None) -> "TextComposer":
        from ..utils.io import load_tensors, load_weights
        path = Path(path)
        if not (path / CONFIG).is_file():
            raise FileNotFoundError(f"no composer checkpoint at {path}: expected {CONFIG}, {MAPPER} and {TEXT}")
        from ..records import built, read
        meta = read(CONFIG, path / CONFIG)
        if expect is not None and meta.get("model") != expect:
            raise ValueError(f"{path / CONFIG} is a {meta.get('model')!r} checkpoint, not {expect!r}")
        cfg_cls = VSIConfig if meta["mapper"] == "vsi" else Pic2WordConfig
        mapper = built(path / CONFIG, lambda: build_mapper(meta["mapper"], cfg_cls(**meta["mapper_config"])))
        fix = f"retrain it with `foco {meta.get('model', 'pact')} train`"
        load_weights(mapper, load_tensors(path / MAPPER, fix), path / MAPPER, fix)
        raw = dict(meta["text"])
        text = built(path / CONFIG, lambda: tunable_text(backbone, TextTuneConfig(
            **{**raw, "lora_targets": tuple(raw["lora_targets"])})))
        text.load_trainable(load_tensors(path / TEXT, fix))
        return TextComposer(meta["model"], meta["mapper"], mapper, text).eval()


class ComposerMethod(QueryMethod):
    """A trained `TextComposer` as a retrieval method; `name` is the checkpoint's method ("pact" or "tscir")."""

    needs_text_tower = True
    served = False  # not offered by serving: its queries there are not yet checked against evaluation's
    name = ""
    mapper = ""  # the mapper its trainer builds; a VSI mapper reads the reference's patches (`reads_patches`)

    def __init__(self, composer: TextComposer):
        self.composer = composer.eval()

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "ComposerMethod":
        path = require(opts, cls.options[0], cls.name)
        backbone = require_backbone(opts, cls.name, "reads its query with the text tower")
        composer = TextComposer.load(path, backbone, expect=cls.name)
        if composer.mapper_kind != cls.mapper:
            raise ValueError(f"{path}: a {cls.name} checkpoint with a {composer.mapper_kind!r} mapper; `foco "
                             f"{cls.name} train` builds a {cls.mapper!r} one: retrain it with that command")
        return cls(composer)

    def modules(self) -> list[torch.nn.Module]:
        return [self.composer]

    @torch.no_grad()
    def encode(self, batch: QueryBatch) -> ComposedQuery:
        q = self.composer(batch.reference.global_, batch.reference.patches, list(batch.texts))  # (B, D)
        return ComposedQuery(query=F.normalize(q, dim=-1), attention=None, v_loc=None)


class PACTMethod(ComposerMethod):
    name = "pact"
    mapper = "pic2word"  # the global feature alone
    options = (MethodOption("pact", "--pact", "a folder of `foco pact train`", parse=Path, record="composer.json"),)


class TSCIRMethod(ComposerMethod):
    name = "tscir"
    mapper = "vsi"
    reads_patches = True  # VSI's cross-attention over the reference's patches
    options = (MethodOption("tscir", "--tscir", "a folder of `foco tscir train`", parse=Path, record="composer.json"),)
