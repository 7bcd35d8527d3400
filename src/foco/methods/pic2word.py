"""Pic2Word (Saito et al., CVPR 2023): an image becomes a pseudo word in the text tower's token-embedding space.

A mapping network phi (3 linear layers, as the paper's IM2TEXT) takes the image's global feature v to a token
embedding s = phi(v). It is trained on images alone: the text feature of "a photo of *" with * = s must retrieve
its own image among the batch, with the symmetric contrastive loss

    L = CE(tau^-1 * V T^T, I) / 2 + CE(tau^-1 * T V^T, I) / 2,     T_b = f_text("a photo of *" | * = phi(v_b)),

with the frozen towers and the backbone's own temperature tau. At query time the composed query is the text
feature of a template such as "a photo of * that {modification}" with * = phi(v_reference).

The query needs the text tower, not cached text features: `Pic2WordMethod.needs_text_tower` is True, and the
method holds the backbone it was built with (`MethodOptions.backbone`). Training is `foco.train.pic2word`.

Query templates (`--pic2word-template`, a name of `TEMPLATES` or a literal text with `*` and `{}`):

* `searle` (the default of checkpoints made so far): "a photo of * that {}", SEARLE's and LinCIR's phrasing;
* `pic2word-cirr`: "a photo of * , {}", the template Pic2Word's reference evaluation (google-research/
  composed_image_retrieval) composes CIRR queries with.

A mapper in the reference's state-dict layout (IM2TEXT: `layers.{i}.0.weight/bias`, `fc_out.weight/bias`, with or
without DDP's `module.` prefix), converted to safetensors, loads with `Pic2WordMapper.from_im2text`.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import torch
import torch.nn as nn

from ..backbones.pseudo import PseudoTokenBackbone
from ..model.encoder import ComposedQuery
from ..utils.io import atomic_write_bytes, atomic_write_text
from .base import MethodOption, MethodOptions, QueryBatch, QueryMethod, require, require_backbone

WEIGHTS, CONFIG = "pic2word.safetensors", "pic2word.json"

MAPPER_INPUTS = ("raw", "normalized")
TEMPLATES = {"searle": "a photo of * that {}", "pic2word-cirr": "a photo of * , {}"}


def mapper_input(image: torch.Tensor, norm: torch.Tensor | None, kind: str, where: str) -> torch.Tensor:
    """What the mapper reads, (B, D): the normalised globals, or with `kind` "raw" the globals times their norms
    (B,). A raw mapper without norms is refused: `where` names the features."""
    if kind == "normalized":
        return image.float()
    if kind != "raw":
        raise ValueError(f"--mapper-input {kind!r}: choose from {', '.join(MAPPER_INPUTS)}")
    if norm is None:
        raise ValueError(f"{where} has no norms of the raw image embeddings, which a Pic2Word mapper with raw input "
                         "reads: extract the features again with this foco (`foco features extract` keeps them), or "
                         "train the mapper with --mapper-input normalized")
    return image.float() * norm.float().to(image.device)[:, None]


def resolve_template(template: str, placeholder: str = "*") -> str:
    """A template's text: a name of `TEMPLATES`, or a literal with one `{}` (the modification; `{{` and `}}` are
    literal braces) and a free-standing `placeholder`. Anything else is refused, naming the names and the flag.
    The one parser of a query template (evaluation, search and serving build the method through it)."""
    import string
    text = TEMPLATES.get(template, template)
    why = None
    try:
        fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(text) if name is not None]
    except ValueError as exc:  # an unmatched brace
        fields, why = [], str(exc)
    if why is None and (len(fields) != 1 or fields[0] != ("", "", None)):
        why = f"it holds {len(fields)} fields {[f'{{{n}}}' for n, _, _ in fields]}, not one empty {{}}"
    if why is None and placeholder not in text.split():  # it must tokenize alone: spaces around it
        why = f"no free-standing {placeholder!r}"
    if why is not None:
        raise ValueError(f"--pic2word-template {template!r} is neither a template name ({', '.join(TEMPLATES)}) nor "
                         f"a text with one '{{}}' and a free-standing {placeholder!r} ({why})")
    return text


def template_slots(template: str, placeholder: str = "*") -> tuple[int, int]:
    """(first, last): the template's placeholders before and after its `{}`, the only slots of the pseudo word in
    a query (`foco.backbones.pseudo.placeholder_slots`): a `*` the user typed stays a `*`."""
    import string
    parts = list(string.Formatter().parse(template))  # (literal, field, spec, conversion): `{{` read as a brace
    at = next(i for i, (_, name, _, _) in enumerate(parts) if name is not None)
    prefix = "".join(lit for lit, *_ in parts[:at + 1])
    suffix = "".join(lit for lit, *_ in parts[at + 1:])
    return prefix.split().count(placeholder), suffix.split().count(placeholder)


@dataclass
class Pic2WordConfig:
    image_dim: int = 256  # D, the backbone's joint space (set from the image features)
    token_dim: int = 384  # E, the text tower's token-embedding width (set from the backbone)
    hidden_dim: int = 512  # width of the two hidden layers (the paper's middle_dim)
    dropout: float = 0.1
    train_prompt: str = "a photo of *"  # the text the pseudo word is trained in
    query_template: str = "a photo of * that {}"  # {} = the modification text
    placeholder: str = "*"  # the word replaced by the pseudo token; must be one token, spaces around it
    mapper_input: str = "raw"  # MAPPER_INPUTS: "raw", the unnormalised image embedding (the reference's), or
                               # "normalized" (foco's mappers before; a config that lacks the key is one)


class Pic2WordMapper(nn.Module):
    """phi: (B, D) image global features -> (B, E) pseudo-token embeddings. Linear-Dropout-ReLU twice, then Linear."""

    def __init__(self, cfg: Pic2WordConfig):
        super().__init__()
        self.cfg = cfg
        layers: list[nn.Module] = []
        dim = cfg.image_dim
        for _ in range(2):
            layers += [nn.Linear(dim, cfg.hidden_dim), nn.Dropout(cfg.dropout), nn.ReLU()]
            dim = cfg.hidden_dim
        layers.append(nn.Linear(dim, cfg.token_dim))
        self.net = nn.Sequential(*layers)

    @classmethod
    def from_im2text(cls, state: dict[str, torch.Tensor], cfg: Pic2WordConfig | None = None) -> "Pic2WordMapper":
        """A mapper with the weights of a state dict in the reference's IM2TEXT layout (two hidden layers):
        `layers.0.0` -> `net.0`, `layers.1.0` -> `net.3`, `fc_out` -> `net.6`; DDP's `module.` prefix is dropped.
        The dimensions are read from the weights; `cfg` gives the rest (prompt, template, dropout)."""
        state = {k[len("module."):] if k.startswith("module.") else k: v for k, v in state.items()}
        names = {"layers.0.0": "net.0", "layers.1.0": "net.3", "fc_out": "net.6"}
        wanted = {f"{a}.{w}" for a in names for w in ("weight", "bias")}
        if set(state) != wanted:
            missing, extra = sorted(wanted - set(state)), sorted(set(state) - wanted)
            raise ValueError(f"not an IM2TEXT state dict with two hidden layers (missing {missing or 'none'}, "
                             f"unexpected {extra or 'none'})")
        hidden, image_dim = state["layers.0.0.weight"].shape
        cfg = replace(cfg or Pic2WordConfig(), image_dim=int(image_dim), hidden_dim=int(hidden),
                      token_dim=int(state["fc_out.weight"].shape[0]))
        mapper = cls(cfg)
        mapper.load_state_dict({f"{ours}.{w}": state[f"{theirs}.{w}"].float() for theirs, ours in names.items()
                                for w in ("weight", "bias")})
        return mapper

    def forward(self, image_global: torch.Tensor) -> torch.Tensor:
        return self.net(image_global)  # (B, E)

    def save(self, path: str | Path, meta: dict | None = None) -> None:
        from safetensors.torch import save as st_save
        path = Path(path)
        atomic_write_bytes(path / WEIGHTS, st_save({k: v.detach().cpu().contiguous()
                                                    for k, v in self.state_dict().items()}))
        atomic_write_text(path / CONFIG, json.dumps({"model": "pic2word", "config": asdict(self.cfg), **(meta or {})},
                                                    indent=2) + "\n")

    @staticmethod
    def load(path: str | Path) -> "Pic2WordMapper":
        from ..utils.io import load_tensors, load_weights
        path = Path(path)
        from ..records import built, read
        meta = read(CONFIG, path / CONFIG)
        if meta.get("model") != "pic2word":
            raise ValueError(f"{path / CONFIG} is not a Pic2Word checkpoint config")
        mapper = built(path / CONFIG, lambda: Pic2WordMapper(Pic2WordConfig(**{"mapper_input": "normalized",
                                                                                 **meta["config"]})))
        fix = "retrain it with `foco pic2word train`"
        load_weights(mapper, load_tensors(path / WEIGHTS, fix), path / WEIGHTS, fix)
        return mapper.eval()


MAPPER = MethodOption("pic2word", "--pic2word", "a Pic2Word mapper folder of `foco pic2word train`", parse=Path,
                      record="pic2word.json")


class Pic2WordMethod(QueryMethod):
    """Composed queries from a trained mapper: text feature of `query_template` with * = phi(v_reference), the
    modification text in place of {}. Holds the backbone whose text tower reads the template."""

    needs_text_tower = True
    options = (MAPPER, MethodOption("query_template", "--pic2word-template",
                            "the query template: " + ", ".join(f"{k} ({v!r})" for k, v in TEMPLATES.items()) +
                            ", or a text with * and {} (default: the one the mapper records)"),)

    def __init__(self, mapper: Pic2WordMapper, backbone: PseudoTokenBackbone | None = None,
                 query_template: str | None = None):
        self.mapper = mapper.eval()
        self.backbone = backbone
        self.template = resolve_template(query_template or mapper.cfg.query_template, mapper.cfg.placeholder)

    @classmethod
    def load(cls, path: str | Path, backbone: PseudoTokenBackbone | None = None,
             query_template: str | None = None) -> "Pic2WordMethod":
        return cls(Pic2WordMapper.load(path), backbone, query_template)

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "Pic2WordMethod":
        folder = require(opts, MAPPER, "pic2word")
        backbone = require_backbone(opts, "pic2word", "reads its query with the text tower")
        return cls.load(folder, backbone, opts.get("query_template"))

    @property
    def reads_norm(self) -> bool:
        return self.mapper.cfg.mapper_input == "raw"

    def prompts(self, modifications: Sequence[str]) -> list[str]:
        return [self.template.format(m) for m in modifications]

    def modules(self) -> list[torch.nn.Module]:
        return [self.mapper]

    def encode(self, batch: QueryBatch) -> ComposedQuery:
        if self.backbone is None:
            raise ValueError("Pic2WordMethod was built without a backbone; pass one (MethodOptions.backbone)")
        v = mapper_input(batch.reference.global_, batch.reference.norm, self.mapper.cfg.mapper_input,
                         "the reference features")
        return self.encode_raw(v, batch.texts, self.backbone)

    @torch.no_grad()
    def encode_raw(self, reference_global: torch.Tensor, modifications: Sequence[str],
                   backbone: PseudoTokenBackbone) -> ComposedQuery:
        """B mapper inputs (B, D) (`mapper_input`) and B modification strings -> B normalised queries (B, D)."""
        if reference_global.shape[0] != len(modifications):
            raise ValueError(f"{reference_global.shape[0]} references for {len(modifications)} modifications")
        tokens = self.mapper(reference_global.float())  # (B, E)
        text = backbone.encode_texts_with_tokens(self.prompts(modifications), tokens, self.mapper.cfg.placeholder,
                                                 keep=template_slots(self.template, self.mapper.cfg.placeholder))
        return ComposedQuery(query=text.global_, attention=None, v_loc=None)
