"""LinCIR (Gu et al., CVPR 2024, "Language-only Training of Zero-shot Composed Image Retrieval"), as its public code
runs it (navervision/lincir: models.py, train_phi.py, loader.py, encode_with_pseudo_tokens.py, validate.py).

A projection phi maps a joint-space embedding to a token embedding of the text tower. It is trained on text
alone, by self-masking projection: a caption's keyword runs (spaCy NOUN, PROPN, ADJ and DET runs) are each replaced
by the placeholder, phi reads the caption's own text embedding with Gaussian noise of a random scale, and the text
embedding of the masked caption with every placeholder read as phi's output must equal the caption's:

    e   = f_text(caption)                                (the raw, unnormalised projected embedding)
    s   = phi(e + u * n),   u ~ U[0, 1) per caption,  n ~ N(0, I)
    L   = MSE(f_text(masked caption | every placeholder = s), e)

At query time phi reads the reference image's raw embedding (image and text share the joint space) and the query
is the text embedding of "a photo of * that {modification}" with * = phi(v_reference), validate.py's template.

phi is SEARLE's Phi: Linear(D, 4D), GELU, Dropout(0.5), Linear(4D, 4D), GELU, Dropout(0.5), Linear(4D, E), the
reference's sizes (`hidden_dim=projection_dim * 4`, `phi_dropout` 0.5). The placeholder is "*", the word foco's
pseudo-token backbones read (the reference's CLIP tokenizer reads "$" and a special "[$]"; the world's text tower
has no such single token). Training is `foco.train.lincir`; `experiments/lincir_reference.py` checks phi, the
masking and the loss against the reference code.
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
from .pic2word import mapper_input, resolve_template, template_slots

WEIGHTS, CONFIG = "lincir.safetensors", "lincir.json"


@dataclass
class LinCIRConfig:
    embed_dim: int = 256  # D, the joint space (set from the backbone)
    token_dim: int = 384  # E, the text tower's token-embedding width (set from the backbone)
    hidden_ratio: int = 4  # phi's hidden width, x D (the reference's projection_dim * 4)
    dropout: float = 0.5  # the reference's --phi_dropout
    noise: float = 1.0  # the scale of the input noise: e + noise * U[0, 1) * N(0, I) (train_phi.py's 1.0)
    query_template: str = "a photo of * that {}"  # validate.py's, with foco's placeholder
    placeholder: str = "*"


class LinCIRPhi(nn.Module):
    """phi: (B, D) raw embeddings -> (B, E) token embeddings; SEARLE's Phi, in the reference's layout
    (`layers.{0,3,6}` are the linear layers), so a reference state dict loads as it is. `SEARLEPhi` is the same
    network under SEARLE's own record (`foco.methods.searle`): the class attributes name the files."""

    NAME, LABEL, WEIGHTS, CONFIG, TRAIN = "lincir", "LinCIR", WEIGHTS, CONFIG, "foco lincir train"
    CONFIG_CLASS = LinCIRConfig

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        hidden = cfg.embed_dim * cfg.hidden_ratio
        self.layers = nn.Sequential(nn.Linear(cfg.embed_dim, hidden), nn.GELU(), nn.Dropout(cfg.dropout),
                                    nn.Linear(hidden, hidden), nn.GELU(), nn.Dropout(cfg.dropout),
                                    nn.Linear(hidden, cfg.token_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # (B, E)

    def save(self, path: str | Path, meta: dict | None = None) -> None:
        from safetensors.torch import save as st_save
        path = Path(path)
        atomic_write_bytes(path / self.WEIGHTS, st_save({k: v.detach().cpu().contiguous()
                                                         for k, v in self.state_dict().items()}))
        atomic_write_text(path / self.CONFIG, json.dumps({"model": self.NAME, "config": asdict(self.cfg),
                                                          **(meta or {})}, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "LinCIRPhi":
        from ..utils.io import load_tensors, load_weights
        path = Path(path)
        from ..records import built, read
        meta = read(cls.CONFIG, path / cls.CONFIG)
        if meta.get("model") != cls.NAME:
            raise ValueError(f"{path / cls.CONFIG} is not a {cls.LABEL} checkpoint config; train one with "
                             f"`{cls.TRAIN}`")
        phi = built(path / cls.CONFIG, lambda: cls(cls.CONFIG_CLASS(**meta["config"])))
        fix = f"retrain it with `{cls.TRAIN}`"
        load_weights(phi, load_tensors(path / cls.WEIGHTS, fix), path / cls.WEIGHTS, fix)
        return phi.eval()


PHI = MethodOption("lincir", "--lincir", "a LinCIR phi folder of `foco lincir train`", parse=Path,
                   record="lincir.json")


class LinCIRMethod(QueryMethod):
    """Composed queries from a trained phi: the text embedding of the template with * = phi(raw v_reference)."""

    needs_text_tower = True
    options = (PHI,)
    PHI_CLASS = LinCIRPhi  # what `from_options` loads from the folder of `options[0]` (SEARLE: its own record)

    def __init__(self, phi: LinCIRPhi, backbone: PseudoTokenBackbone | None = None):
        self.phi = phi.eval()
        self.backbone = backbone
        self.template = resolve_template(phi.cfg.query_template, phi.cfg.placeholder)

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "LinCIRMethod":
        name = cls.PHI_CLASS.NAME
        folder = require(opts, cls.options[0], name)
        backbone = require_backbone(opts, name, "reads its query with the text tower")
        return cls(cls.PHI_CLASS.load(folder), backbone)

    def modules(self) -> list[torch.nn.Module]:
        return [self.phi]

    @property
    def reads_norm(self) -> bool:
        return True  # phi reads the raw embedding, as LinCIR trains it

    def encode(self, batch: QueryBatch) -> ComposedQuery:
        if self.backbone is None:
            raise ValueError(f"{type(self).__name__} was built without a backbone; pass one (MethodOptions.backbone)")
        v = mapper_input(batch.reference.global_, batch.reference.norm, "raw", "the reference features")  # (B, D)
        return self.encode_raw(v, batch.texts, self.backbone)

    @torch.no_grad()
    def encode_raw(self, reference_raw: torch.Tensor, modifications: Sequence[str],
                   backbone: PseudoTokenBackbone) -> ComposedQuery:
        """B raw reference embeddings (B, D) and B modification strings -> B normalised queries (B, D)."""
        if reference_raw.shape[0] != len(modifications):
            raise ValueError(f"{reference_raw.shape[0]} references for {len(modifications)} modifications")
        tokens = self.phi(reference_raw.float())  # (B, E)
        text = backbone.encode_texts_with_tokens([self.template.format(m) for m in modifications], tokens,
                                                 self.phi.cfg.placeholder,
                                                 keep=template_slots(self.template, self.phi.cfg.placeholder))
        return ComposedQuery(query=text.global_, attention=None, v_loc=None)
