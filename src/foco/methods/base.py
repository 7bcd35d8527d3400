"""What every composed-query method receives and returns.

A method turns a batch of (reference image, modification text) into normalised query vectors in the gallery's
space. Every method composes from the same `QueryBatch`: cached reference features, cached text features and the
raw texts. Methods that re-encode text (Pic2Word, FoCo with T_m decomposed) hold the backbone's text tower from
their construction (`MethodOptions.backbone`), so no caller branches on the kind of method. Each method declares
what it is built from as `MethodOption`s (its weights folder, its settings); the registry collects them for the
command line, the provenance checks and serving.
"""
from __future__ import annotations

from dataclasses import dataclass
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
    box_mask: torch.Tensor | None = None  # (B, P) bool, patches inside the box (methods with `reads_box`)


@dataclass(frozen=True)
class MethodOption:
    """An option one method declares beside itself (`QueryMethod.options`), as a benchmark reader declares its
    `ReaderOption`s: `foco eval` offers `--FLAG VALUE` for every declared option and hands the parsed value to the
    method as `MethodOptions.get(name)`.

    An option with a `record` is a trained method's weights folder: `record` is the file in it that records the
    backbone the weights were trained on. Every consumer checks that record against the features it is used with
    (`foco.methods.provenance.check_trained_on`), and a folder given for a method that is not evaluated is still
    checked (and may name the backbone, as `--checkpoint` does). Any other option given for a method that is not evaluated is refused, unless
    it is not `strict` (parsed, then unused: `--slerp-alpha`, which every evaluation took before methods declared
    their options).

    An option with a `val_grid` may be given as "val": evaluation then chooses it per benchmark part on the val
    split, over that grid, by the protocol's headline metric (`foco.eval.select.choose_on_val`), and builds the
    method with the chosen value. The method itself is only ever built with a value."""

    name: str  # the key in MethodOptions
    flag: str  # the command-line flag
    help: str
    default: str | None = None  # as typed on the command line; None: the method's own default
    parse: Callable[[str], Any] = str
    record: str | None = None  # a weights folder: the file in it that records its backbone (e.g. "foco.json")
    strict: bool = True  # given for a method that is not evaluated: refused (True) or parsed and unused (False)
    val_grid: tuple[float, ...] | None = None  # "val" chooses the value on the val split over this grid
    own_backbone: str | None = None  # a weights folder that is itself a backbone of this kind (`tat`): its
                                     # features are those of KIND:FOLDER wherever the folder lies now

    def on_val(self, opts: "MethodOptions") -> bool:
        """Whether `opts` asks for this option to be chosen on the val split."""
        return self.val_grid is not None and opts.get(self.name) == "val"


class MethodOptions:
    """Everything a method may be built from: the values of the methods' own `MethodOption`s, by name, and the
    backbone whose text tower the methods with `needs_text_tower` read text with. Each method reads the values it
    declared; `build_method` refuses a name no registered method declares.

        MethodOptions(checkpoint=Path("runs/foco"), backbone=bb)
        opts.get("checkpoint")                  # a value, or None when not given
        opts.replace(slerp_alpha=0.4)           # a copy with values laid over
    """

    def __init__(self, *, backbone: "Backbone | None" = None, device: str | torch.device = "cpu",
                 unverified: bool = False, **values: Any):
        self.backbone = backbone
        self.device = torch.device(device)  # where the methods' trained modules run (`QueryMethod.to`)
        # --unverified: a weights folder whose record lost what it was trained on is used unchecked (and the
        # results say so) instead of refused (`foco.methods.provenance`)
        self.unverified = unverified
        self.values = {k: v for k, v in values.items() if v is not None}  # None: not given

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)

    def replace(self, **values: Any) -> "MethodOptions":
        backbone = values.pop("backbone", self.backbone)
        device = values.pop("device", self.device)
        unverified = values.pop("unverified", self.unverified)
        return MethodOptions(backbone=backbone, device=device, unverified=unverified, **{**self.values, **values})

    def __repr__(self) -> str:
        return (f"MethodOptions(backbone={self.backbone!r}, device={str(self.device)!r}, unverified={self.unverified}, "
                f"{self.values!r})")


def require(opts: MethodOptions, option: MethodOption, method: str) -> Any:
    """`option`'s value in `opts`, or a ValueError saying that `method` needs its flag (and what it is)."""
    value = opts.get(option.name)
    if value is None:
        raise ValueError(f"method {method} needs {option.flag} ({option.help})")
    return value


def require_backbone(opts: MethodOptions, method: str, why: str) -> "Backbone":
    if opts.backbone is None:
        raise ValueError(f"method {method} {why} and needs --backbone (or a trained method's folder that records it)")
    return opts.backbone


class QueryMethod:
    """Base of every method: `encode(QueryBatch) -> ComposedQuery` with `query` (B, D) L2-normalised.

    Class attributes say what a method reads beyond the cached features, so that callers can check up front:
    `needs_text_tower` (built with `MethodOptions.backbone`), `reads_patches` (reads the reference's patch
    features, `QueryBatch.reference.patches`: serving computes and hands them over only to such methods),
    `reads_anchor` (uses `QueryBatch.anchor` and `attn_bias`; other methods refuse them rather than ignore them) and
    `options` (its own command-line options).

    A method runs on `device` (`to`, which `build_method` calls with `MethodOptions.device`): its trained modules
    live there, and `encode` takes a batch there (`foco.eval.compose` and the search engine move it) and gives its
    query there.
    """

    device: torch.device = torch.device("cpu")

    needs_text_tower: ClassVar[bool] = False
    reads_patches: ClassVar[bool] = False
    reads_anchor: ClassVar[bool] = False
    reads_box: ClassVar[bool] = False  # uses `QueryBatch.box_mask` (AdaFocal)
    options: ClassVar[tuple[MethodOption, ...]] = ()  # the method's own options (`MethodOption`)
    served: ClassVar[bool] = True  # offered by `foco serve` / `foco search` when its weights folders are given

    @property
    def reads_norm(self) -> bool:
        """Whether `encode` reads `QueryBatch.reference.norm` (the raw embedding's norm, which a feature cache keeps
        and a search index does not): a server refuses such a method at startup rather than fail its queries."""
        return False

    @classmethod
    def from_options(cls, opts: MethodOptions) -> "QueryMethod":
        return cls()

    def modules(self) -> list[torch.nn.Module]:
        """The trained modules `to` moves (none for the training-free methods)."""
        return []

    def close(self) -> None:
        """Releases what the method holds open (a decomposer's server connection); nothing by default."""

    def to(self, device: str | torch.device) -> "QueryMethod":
        for module in self.modules():
            module.to(device)
        self.device = torch.device(device)
        return self

    def encode(self, batch: QueryBatch) -> ComposedQuery:
        raise NotImplementedError


def plain_query(q: torch.Tensor) -> ComposedQuery:
    """(B, D) -> a ComposedQuery of the L2-normalised rows, without attention."""
    return ComposedQuery(query=torch.nn.functional.normalize(q, dim=-1), attention=None, v_loc=None)
