"""What every composed-query method receives and returns.

A method turns a batch of (reference image, modification text) into normalised query vectors in the gallery's
space. Every method composes from the same `QueryBatch`: cached reference features, cached text features and the
raw texts. Methods that re-encode text (Pic2Word, FoCo with T_m decomposed) hold the backbone's text tower from
their construction (`MethodOptions.backbone`), so no caller branches on the kind of method.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import torch

from ..backbones.base import ImageFeatures, TextFeatures
from ..model.encoder import ComposedQuery

if TYPE_CHECKING:
    from ..backbones.base import Backbone


@dataclass
class QueryBatch:
    """B composed-retrieval queries."""

    reference: ImageFeatures  # (B, D) globals, (B, P, D) patches
    modification: TextFeatures  # (B, D), (B, L, D), (B, L): the modification texts' cached features
    texts: Sequence[str]  # the B modification texts themselves
    anchor: torch.Tensor | None = None  # (B, D) a separate F_Aggr anchor text (T_m decomposed); None: T_m
    attn_bias: torch.Tensor | None = None  # (B, P) additive F_Aggr attention logits (box anchoring)


@dataclass
class MethodOptions:
    """Everything a method may be built from; each method reads the fields it needs."""

    checkpoint: Path | None = None  # FoCo checkpoint folder (foco.safetensors + foco.json)
    foco_edits: Path | None = None  # a FoCo checkpoint trained with the edit stage (`foco train --edits`)
    pic2word: Path | None = None  # Pic2Word mapper folder (`foco pic2word train`)
    pact: Path | None = None  # PACT composer folder (`foco pact train`)
    tscir: Path | None = None  # TSCIR composer folder (`foco tscir train`)
    slerp_alpha: float = 0.5  # slerp's interpolation weight (0: image, 1: text)
    backbone: "Backbone | None" = None  # the text tower, for methods with needs_text_tower
    declared: dict[str, Any] = field(default_factory=dict)  # values of the methods' own `MethodOption`s, by name


@dataclass(frozen=True)
class MethodOption:
    """An option one method declares beside itself (`QueryMethod.options`), as a benchmark reader declares its
    `ReaderOption`s: `foco eval` offers `--FLAG VALUE` for every method and hands the parsed value to the method as
    `MethodOptions.declared[name]`; a value given to a method that is not evaluated is refused."""

    name: str  # the key in MethodOptions.declared
    flag: str  # the command-line flag
    help: str
    default: str | None = None  # as typed on the command line; None: the method's own default
    parse: Callable[[str], Any] = str


# MethodOptions field -> (its flag, the file in the folder that records the backbone)
_RECORDS = {"checkpoint": ("--checkpoint", "foco.json"), "foco_edits": ("--foco-edits", "foco.json"),
            "pic2word": ("--pic2word", "pic2word.json"), "pact": ("--pact", "composer.json"),
            "tscir": ("--tscir", "composer.json")}


def recorded_backbones(opts: MethodOptions) -> list[tuple[str, Path, object]]:
    """(flag, folder, recorded backbone) of every trained method's folder in `opts` that records one: each was
    trained on features of that backbone, and must be used on features of the same."""
    from ..utils.io import read_json
    out = []
    for name, (flag, config) in _RECORDS.items():
        folder = getattr(opts, name)
        if folder is None or not (Path(folder) / config).is_file():
            continue
        meta = read_json(Path(folder) / config)
        recorded = (meta.get("provenance") or {}).get("backbone") or meta.get("backbone")
        if recorded is not None:
            out.append((flag, Path(folder), recorded))
    return out


def check_trained_on(opts: MethodOptions, backbone, what: str, fix: str) -> None:
    """Refuses a trained method's folder made on another backbone's features than `backbone` (a record or a
    spec) of `what`, naming both, the flag and `fix`."""
    from ..backbones import check_same_backbone
    for flag, folder, recorded in recorded_backbones(opts):
        check_same_backbone(recorded, f"{flag} {folder}", backbone, what,
                            f"{fix}, or pass a {flag} trained on that backbone's features")


class QueryMethod:
    """Base of every method: `encode(QueryBatch) -> ComposedQuery` with `query` (B, D) L2-normalised.

    Class attributes say what a method reads beyond the cached features, so that callers can check up front:
    `needs_text_tower` (built with `MethodOptions.backbone`), `reads_anchor` (uses `QueryBatch.anchor` and
    `attn_bias`; other methods refuse them rather than ignore them) and `options` (its own command-line options).
    """

    needs_text_tower: ClassVar[bool] = False
    reads_anchor: ClassVar[bool] = False
    options: ClassVar[tuple[MethodOption, ...]] = ()  # the method's own options (`MethodOption`)

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "QueryMethod":
        return cls()

    def encode(self, batch: QueryBatch) -> ComposedQuery:
        raise NotImplementedError


def plain_query(q: torch.Tensor) -> ComposedQuery:
    """(B, D) -> a ComposedQuery of the L2-normalised rows, without attention."""
    return ComposedQuery(query=torch.nn.functional.normalize(q, dim=-1), attention=None, v_loc=None)
