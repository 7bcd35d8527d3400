"""The field side by side on a world benchmark: every method, every metric, one table, one set of cached features.

    results = compare_methods(world, "test", features, ["foco", "pic2word", "slerp", "sum", "image", "text"],
                              MethodOptions(checkpoint=..., pic2word=..., slerp_alpha="val", chord="val"))

Methods that compose from cached features (FoCo, the simple baselines, slerp) and those that need the text tower at
query time (Pic2Word) are scored on the same gallery features with the same metric functions. "val" for slerp's
alpha or Chord's lambda means: chosen on the val benchmark of the same protocol (its features must be cached as
FEATURES/val-<protocol>); the chosen values are returned with the results.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .baselines import METHODS, build_method
from .evaluate import BenchmarkFeatures, compose_queries, load_benchmark_features, score_queries

FIELD = ("foco", "pic2word", "slerp", *[m for m in METHODS if m != "foco"])
DECOMPOSED = ("foco+rule", "foco+llm")  # FoCo with T_m decomposed at inference (paper §3.4, optional)


@dataclass
class MethodOptions:
    checkpoint: Path | None = None  # FoCo
    pic2word: Path | None = None  # Pic2Word mapper folder (foco pic2word train)
    backbone: str | None = None  # backbone spec, for methods that encode raw text (Pic2Word)
    slerp_alpha: float | str = "val"
    chord: float | str | None = None  # None: plain cosine; a float; or "val"


def _queries(name: str, method, bf: BenchmarkFeatures, backbone) -> torch.Tensor:
    from .methods import compose_raw_queries, needs_backbone
    if needs_backbone(method):
        if backbone is None:
            raise ValueError(f"method {name} encodes raw text and needs --backbone")
        return compose_raw_queries(method, bf, backbone)
    return compose_queries(method, bf)


def compare_methods(world: str | Path, split: str, features: str | Path, names: list[str], opts: MethodOptions,
                    protocols: tuple[str, ...] = ("single", "multi")) -> dict:
    from .methods import Pic2WordMethod, SlerpMethod, choose_alpha
    unknown = [n for n in names if n not in FIELD + DECOMPOSED]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {', '.join(FIELD + DECOMPOSED)}")
    features = Path(features)
    backbone = None
    if "pic2word" in names and opts.pic2word is None:
        raise ValueError("method pic2word needs --pic2word DIR (train one with `foco pic2word train`)")
    raw = [n for n in names if n == "pic2word" or n in DECOMPOSED]
    if raw:
        from .backbones import create_backbone
        if not opts.backbone:
            raise ValueError(f"method(s) {raw} encode raw text and need --backbone (or a FoCo checkpoint that "
                             "records it)")
        backbone = create_backbone(opts.backbone)
    results: dict = {"benchmark": f"world/{split}", "protocols": {}, "methods": {}, "chosen": {}}
    for protocol in protocols:
        bf = load_benchmark_features(world, split, protocol, features / f"{split}-{protocol}")
        results["protocols"][protocol] = {"queries": len(bf.ref_index), "gallery": len(bf.bench.gallery_ids)}
        val: BenchmarkFeatures | None = None

        def val_bf() -> BenchmarkFeatures:
            nonlocal val
            if val is None:
                cache = features / f"val-{protocol}"
                if not (cache / "manifest.json").is_file():
                    raise ValueError(f"choosing on val needs val features in {cache}: `foco features extract "
                                     f"--split val/{protocol} --out {cache} ...`")
                val = load_benchmark_features(world, "val", protocol, cache)
            return val

        for name in names:
            if name == "slerp":
                alpha = opts.slerp_alpha
                if alpha == "val":
                    alpha, _ = choose_alpha(val_bf())
                    results["chosen"][f"slerp alpha ({protocol})"] = alpha
                method = SlerpMethod(float(alpha))
            elif name == "pic2word":
                method = Pic2WordMethod.load(opts.pic2word)
            elif name in DECOMPOSED:
                q = _decomposed_queries(name.split("+", 1)[1], opts.checkpoint, bf, backbone)
                row = results["methods"].setdefault(name, {})
                row.update(score_queries(q, bf) if opts.chord is None else _chord(q, bf, opts.chord))
                continue
            else:
                method = build_method(name, opts.checkpoint if name == "foco" else None)
            q = _queries(name, method, bf, backbone)
            row = results["methods"].setdefault(name, {})
            if opts.chord is None:
                row.update(score_queries(q, bf))
                continue
            from .chord import choose_lambda, score_queries_chord
            lam = opts.chord
            if lam == "val":
                lam, _ = choose_lambda(_queries(name, method, val_bf(), backbone), val_bf())
                results["chosen"][f"chord lambda {name} ({protocol})"] = lam
            row.update(score_queries_chord(q, bf, float(lam)))
    return results


def _chord(q: torch.Tensor, bf: BenchmarkFeatures, lam) -> dict[str, float]:
    from .chord import score_queries_chord
    if lam == "val":
        raise ValueError("Chord with lambda chosen on val is not offered for the decomposed-T_m variants; "
                         "give a number")
    return score_queries_chord(q, bf, float(lam))


def _decomposed_queries(decomposer_name: str, checkpoint, bf: BenchmarkFeatures, backbone,
                        batch_size: int = 256) -> torch.Tensor:
    """FoCo with T_m's first local phrase as F_Aggr's anchor and T_m as F_Comp's context: (Q, D)."""
    from .backbones.base import ImageFeatures, TextFeatures
    from .decompose import build_decomposer
    from .decompose.modification import modification_anchors
    from .model import ComposedQueryEncoder
    if checkpoint is None:
        raise ValueError("FoCo needs --checkpoint")
    model = ComposedQueryEncoder.load(checkpoint).eval()
    decomposer = build_decomposer(decomposer_name)
    try:
        anchors = modification_anchors(bf.bench.modifications, decomposer)
    finally:
        if hasattr(decomposer, "close"):
            decomposer.close()
    out = []
    with torch.inference_mode():
        anchor_global = backbone.encode_texts(anchors).global_.float()  # (Q, D)
        for s in range(0, len(anchors), batch_size):
            r = bf.ref_index[s:s + batch_size]
            ref = ImageFeatures(bf.gallery.global_[r], bf.gallery.patches[r])
            mod = TextFeatures(bf.texts.global_[s:s + batch_size], bf.texts.tokens[s:s + batch_size],
                               bf.texts.mask[s:s + batch_size])
            out.append(model.encode(ref, mod, anchor=anchor_global[s:s + batch_size]).query.float())
    return torch.cat(out)

