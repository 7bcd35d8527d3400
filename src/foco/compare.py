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
    """(Q, D) queries of method `name` on `bf`: cached features, raw text through the backbone (Pic2Word), or FoCo
    with T_m decomposed at inference (F_Aggr's anchor = T_m's first local phrase, encoded by the backbone)."""
    from .methods import compose_raw_queries, needs_backbone
    if name in DECOMPOSED:
        from .decompose import build_decomposer
        from .decompose.modification import modification_anchors
        decomposer = build_decomposer(name.split("+", 1)[1])
        try:
            anchors = modification_anchors(bf.bench.modifications, decomposer)
        finally:
            if hasattr(decomposer, "close"):
                decomposer.close()
        with torch.inference_mode():
            anchor_global = backbone.encode_texts(anchors).global_.float()  # (Q, D)
        return compose_queries(method, bf, anchors=anchor_global)
    if needs_backbone(method):
        return compose_raw_queries(method, bf, backbone)
    return compose_queries(method, bf)


def compare_methods(world: str | Path, split: str, features: str | Path, names: list[str], opts: MethodOptions,
                    protocols: tuple[str, ...] = ("single", "multi")) -> dict:
    from .methods import choose_alpha
    unknown = [n for n in names if n not in FIELD + DECOMPOSED]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {', '.join(FIELD + DECOMPOSED)}")
    features = Path(features)
    backbone = None
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
            alpha = opts.slerp_alpha
            if name == "slerp" and alpha == "val":
                alpha, _ = choose_alpha(val_bf())
                results["chosen"][f"slerp alpha ({protocol})"] = alpha
            method = build_method("foco" if name in DECOMPOSED else name, opts.checkpoint, pic2word=opts.pic2word,
                                  slerp_alpha=0.5 if alpha == "val" else float(alpha))
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
