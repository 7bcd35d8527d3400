"""Composed-query methods: one registry, one interface (`foco.methods.base.QueryMethod`).

    method = build_method("slerp", slerp_alpha=0.4)
    method = build_method("foco", "runs/foco")
    method = build_method("pic2word", pic2word="runs/p2w", backbone=create_backbone(spec))

Adding a method is one new file with a `QueryMethod` subclass plus one `METHODS.register` line below
(docs/architecture.md shows it). What a method is built from, its weights folder included, it declares itself as
`MethodOption`s (`QueryMethod.options`): `foco eval` offers them as flags, the provenance checks read the weights
folders' records, and `SearchEngine` serves a trained method when its folders are given. Chord rescoring (any
method) is an option of evaluation (`foco.eval.chord`); box anchoring (FoCo) is `QueryBatch.attn_bias`
(`foco.model.box`).
"""
from __future__ import annotations

from ..registry import Registry
from .base import MethodOption, MethodOptions, QueryBatch, QueryMethod, require, require_backbone

METHODS = Registry("method")
METHODS.register("foco", "foco.methods.foco:FoCoMethod")
METHODS.register("foco-edits", "foco.methods.foco:FoCoEdits")  # trained with edits: not in the FoCo paper
METHODS.register("pic2word", "foco.methods.pic2word:Pic2WordMethod")
METHODS.register("lincir", "foco.methods.lincir:LinCIRMethod")  # language-only training (issue 40)
METHODS.register("searle", "foco.methods.searle:SEARLEMethod")  # textual inversion, OTI distilled (issue 57)
METHODS.register("context-i2w", "foco.methods.context_i2w:ContextI2WMethod")  # patch-reading pseudo word (issue 57)
METHODS.register("pact", "foco.methods.composer:PACTMethod")  # seeds/pact-chord.txt
METHODS.register("tscir", "foco.methods.composer:TSCIRMethod")  # seeds/tscir-mapping-to-composing.txt
METHODS.register("slerp", "foco.methods.slerp:SlerpMethod")
METHODS.register("slerp-tat", "foco.methods.slerp:SlerpTATMethod")  # slerp on a TAT-tuned image tower (issue 57)
METHODS.register("image", "foco.methods.simple:ImageOnly")
METHODS.register("text", "foco.methods.text_only:TextOnly")
METHODS.register("sum", "foco.methods.simple:ImageTextSum")
METHODS.register("foco+rule", "foco.methods.foco:FoCoRule")  # T_m decomposed at inference (paper §3.4)
METHODS.register("foco+llm", "foco.methods.foco:FoCoLLM")
METHODS.register("adafocal", "foco.methods.adafocal:AdaFocalMethod")  # OACIR, supervised

DEFAULT_METHODS = ("foco", "image", "text", "sum")


def build_method(name: str, checkpoint=None, opts: MethodOptions | None = None, **options) -> QueryMethod:
    """The method registered as `name`, built from `opts` with `checkpoint` and keyword `options` (values of the
    methods' `MethodOption`s, by name, `backbone` or `device`) laid over it, on `opts.device`. A value no registered
    method declares is refused (a misspelt name would otherwise be dropped)."""
    opts = opts or MethodOptions()
    if checkpoint is not None:
        options["checkpoint"] = checkpoint
    opts = opts.replace(**options)
    unknown = sorted(set(opts.values) - set(declared_options()))
    if unknown:
        raise ValueError(f"no method declares the option(s) {', '.join(unknown)}; declared: "
                         f"{', '.join(sorted(declared_options()))}")
    return METHODS.get(name).from_options(opts).to(opts.device)


def declared_options() -> dict[str, tuple[MethodOption, tuple[str, ...]]]:
    """Every registered method's `MethodOption`s by name, each with the methods that declare it. Two declarations
    of one name must be one option (a subclass inherits its parent's)."""
    out: dict[str, tuple[MethodOption, tuple[str, ...]]] = {}
    for method in METHODS.names():
        for opt in METHODS.get(method).options:
            if opt.name in out and out[opt.name][0] != opt:
                raise ValueError(f"method {method} declares option {opt.name!r} unlike "
                                 f"{', '.join(out[opt.name][1])}: one name, one option")
            if opt.name == "backbone":
                raise ValueError(f"method {method} declares an option named 'backbone', which MethodOptions keeps "
                                 "for the text tower; choose another name")
            flags = {o.flag: n for n, (o, _) in out.items() if n != opt.name}
            if opt.flag in flags:
                raise ValueError(f"method {method}'s option {opt.name!r} takes the flag {opt.flag} of option "
                                 f"{flags[opt.flag]!r}: one flag, one option")
            out[opt.name] = (opt, out.get(opt.name, (opt, ()))[1] + (method,))
    return out


def served_weights() -> dict[str, tuple[MethodOption, tuple[str, ...]]]:
    """The weights-folder options of the methods serving offers (`QueryMethod.served`), by name, each with those
    methods: what `foco search` / `foco serve` take as flags and `SearchEngine.open` as keywords."""
    out = {}
    for name, (opt, owners) in declared_options().items():
        served = tuple(m for m in owners if METHODS.get(m).served)
        if opt.record and served:
            out[name] = (opt, served)
    return out


def needs_text_tower(names) -> bool:
    """Whether any of the named methods reads raw text with the backbone's text tower."""
    return any(METHODS.get(n).needs_text_tower for n in names)


__all__ = ["METHODS", "DEFAULT_METHODS", "MethodOption", "MethodOptions", "QueryBatch", "QueryMethod", "build_method",
           "declared_options", "needs_text_tower", "require", "require_backbone", "served_weights"]
