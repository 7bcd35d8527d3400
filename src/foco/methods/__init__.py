"""Composed-query methods: one registry, one interface (`foco.methods.base.QueryMethod`).

    method = build_method("slerp", slerp_alpha=0.4)
    method = build_method("foco", "runs/foco")
    method = build_method("pic2word", pic2word="runs/p2w", backbone=create_backbone(spec))

Adding a method is one new file with a `QueryMethod` subclass plus one `METHODS.register` line below
(docs/architecture.md shows it). Chord rescoring (any method) is an option of evaluation (`foco.eval.chord`);
box anchoring (FoCo) is `QueryBatch.attn_bias` (`foco.model.box`).
"""
from __future__ import annotations

from dataclasses import replace

from ..registry import Registry
from .base import MethodOption, MethodOptions, QueryBatch, QueryMethod

METHODS = Registry("method")
METHODS.register("foco", "foco.methods.foco:FoCoMethod")
METHODS.register("foco-edits", "foco.methods.foco:FoCoEdits")  # trained with edits: not in the FoCo paper
METHODS.register("pic2word", "foco.methods.pic2word:Pic2WordMethod")
METHODS.register("pact", "foco.methods.composer:PACTMethod")  # seeds/pact-chord.txt
METHODS.register("tscir", "foco.methods.composer:TSCIRMethod")  # seeds/tscir-mapping-to-composing.txt
METHODS.register("slerp", "foco.methods.slerp:SlerpMethod")
METHODS.register("image", "foco.methods.simple:ImageOnly")
METHODS.register("text", "foco.methods.text_only:TextOnly")
METHODS.register("sum", "foco.methods.simple:ImageTextSum")
METHODS.register("foco+rule", "foco.methods.foco:FoCoRule")  # T_m decomposed at inference (paper §3.4)
METHODS.register("foco+llm", "foco.methods.foco:FoCoLLM")

DEFAULT_METHODS = ("foco", "image", "text", "sum")


def build_method(name: str, checkpoint=None, opts: MethodOptions | None = None, **options) -> QueryMethod:
    """The method registered as `name`, built from `opts` with `checkpoint` and keyword `options` (fields of
    `MethodOptions`) laid over it."""
    opts = opts or MethodOptions()
    if checkpoint is not None:
        options["checkpoint"] = checkpoint
    return METHODS.get(name).from_options(replace(opts, **options))


def needs_text_tower(names) -> bool:
    """Whether any of the named methods reads raw text with the backbone's text tower."""
    return any(METHODS.get(n).needs_text_tower for n in names)


__all__ = ["METHODS", "DEFAULT_METHODS", "MethodOption", "MethodOptions", "QueryBatch", "QueryMethod", "build_method",
           "needs_text_tower"]
