"""Evaluating composed-query methods on benchmark parts: cache features, compose, rank, score, submit.

    parts = read_benchmark("cirr", root, "val")
    results = evaluate_parts(parts, create_backbone(spec), EvalConfig(methods=("foco", "sum"), checkpoint=ckpt,
                                                                      cache=Path("runs/cache/cirr-val")))
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..backbones.base import Backbone, ImageFeatures, TextFeatures
from ..baselines import METHODS, QueryMethod, build_method
from ..features import ExtractConfig
from .base import CIRBenchmark
from .cache import PartFeatures, cache_part, load_part, part_folder
from .scoring import Chord, rank, score
from .submission import write_submission

log = logging.getLogger(__name__)


@dataclass
class EvalConfig:
    methods: tuple[str, ...] = METHODS
    checkpoint: Path | None = None  # FoCo checkpoint folder (method "foco")
    cache: Path = Path("runs/cache")  # feature caches, one subfolder per part
    submission_dir: Path | None = None  # where test-split submission files go (None: not written)
    extract: ExtractConfig = field(default_factory=ExtractConfig)
    compose_batch: int = 256  # queries per method.encode call
    pic2word: Path | None = None  # Pic2Word mapper folder (method "pic2word")
    slerp_alpha: float = 0.5  # method "slerp" (choose it on a val split first)
    chord: float = 0.0  # Chord rescoring lambda for every method (0: plain cosine)
    chord_shortlist: int | None = None  # rescore only the cosine top-N of the full gallery (None: all of it)


def compose(method: QueryMethod, bench: CIRBenchmark, feats: PartFeatures, batch_size: int = 256,
            backbone: Backbone | None = None) -> torch.Tensor:
    """(Q, D) composed queries. With several text variants per query (FashionIQ "both"), each variant is composed
    with the reference and the query is normalize(sum of the normalised variant queries)."""
    n_variants = {len(q.texts) for q in bench.queries}
    if len(n_variants) != 1:
        raise ValueError(f"{bench.name}: queries have different numbers of text variants {sorted(n_variants)}")
    ref_pos = {r: i for i, r in enumerate(feats.reference_ids)}
    text_pos = {t: i for i, t in enumerate(feats.text_ids)}
    ref_rows = torch.tensor([ref_pos[q.reference] for q in bench.queries])  # (Q,)
    per_variant = []
    from ..methods import compose_raw, needs_backbone
    for v in range(n_variants.pop()):
        if needs_backbone(method):  # Pic2Word: raw text through the backbone's text tower
            if backbone is None:
                raise ValueError(f"{type(method).__name__} encodes raw text and needs the backbone")
            per_variant.append(compose_raw(method, feats.references.global_[ref_rows],
                                           [q.texts[v] for q in bench.queries], backbone, batch_size))
            continue
        text_rows = torch.tensor([text_pos[q.texts[v]] for q in bench.queries])  # (Q,)
        out = []
        for s in range(0, len(bench.queries), batch_size):
            r, t = ref_rows[s:s + batch_size], text_rows[s:s + batch_size]
            ref = ImageFeatures(feats.references.global_[r], feats.references.patches[r])
            mod = TextFeatures(feats.texts.global_[t], feats.texts.tokens[t], feats.texts.mask[t])
            with torch.inference_mode():
                out.append(method.encode(ref, mod).query.float())
        per_variant.append(torch.cat(out))  # (Q, D)
    if len(per_variant) == 1:
        return per_variant[0]
    return F.normalize(sum(F.normalize(q, dim=-1) for q in per_variant), dim=-1)


def evaluate_parts(parts: list[CIRBenchmark], backbone: Backbone, cfg: EvalConfig) -> dict:
    """Results of every method on every part, the mean over parts (when they share metrics), and the paths of
    any submission files written."""
    methods = {name: build_method(name, cfg.checkpoint, pic2word=cfg.pic2word, slerp_alpha=cfg.slerp_alpha)
               for name in cfg.methods}
    results: dict = {"benchmark": parts[0].name.split("/")[0], "split": parts[0].split, "backbone": backbone.spec,
                     "checkpoint": str(cfg.checkpoint) if cfg.checkpoint else None,
                     "options": parts[0].options, "parts": {}, "submissions": []}
    for bench in parts:
        folder = part_folder(cfg.cache, bench)
        log.info("%s: %d queries, %d gallery images; features in %s", bench.name, len(bench.queries),
                 len(bench.gallery_ids()), folder)
        cache_part(backbone, bench, folder, cfg.extract)
        feats = load_part(bench, folder)
        entry = {"queries": len(bench.queries), "gallery": len(bench.gallery_ids()), "discarded": bench.discarded,
                 "methods": {}}
        for name, method in methods.items():
            queries = compose(method, bench, feats, cfg.compose_batch, backbone)
            chord = None
            if cfg.chord:
                ref_pos = {r: i for i, r in enumerate(feats.reference_ids)}
                ref_rows = torch.tensor([ref_pos[q.reference] for q in bench.queries])  # (Q,)
                chord = Chord(cfg.chord, feats.references.global_[ref_rows].float(), cfg.chord_shortlist)
            rankings = rank(bench, feats.gallery_ids, feats.gallery, queries, chord)
            entry["methods"][name] = score(bench, rankings)
            if not bench.has_targets and bench.protocol.submission and cfg.submission_dir is not None:
                paths = write_submission(cfg.submission_dir, bench, rankings, name)
                results["submissions"] += [str(p) for p in paths]
        results["parts"][bench.name] = entry
    mean = mean_over_parts(results["parts"])
    if mean:
        results["mean"] = mean
    return results


def mean_over_parts(parts: dict) -> dict[str, dict[str, float]]:
    """Unweighted mean over parts (FashionIQ categories, GeneCIS tasks), when there are several with the same
    metrics; empty otherwise."""
    entries = list(parts.values())
    if len(entries) < 2:
        return {}
    out = {}
    for name in entries[0]["methods"]:
        rows = [e["methods"][name] for e in entries]
        if not rows[0] or any(r.keys() != rows[0].keys() for r in rows):
            return {}
        out[name] = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    return out


def results_table(results: dict) -> str:
    """Markdown: one row per (part, method), then the mean rows."""
    rows = [(part, e["methods"]) for part, e in results["parts"].items()]
    if "mean" in results:
        rows.append(("mean", results["mean"]))
    cols = list(dict.fromkeys(k for _, ms in rows for m in ms.values() for k in m))
    lines = [f"{results['benchmark']} {results['split']}, backbone {results['backbone']}: "
             + ", ".join(f"{p}: {e['queries']} queries / {e['gallery']} gallery"
                         + (f" ({e['discarded']} discarded)" if e["discarded"] else "")
                         for p, e in results["parts"].items()), ""]
    if not cols:
        lines.append("no ground truth in this split: no metrics")
        return "\n".join(lines + [f"submission: {p}" for p in results["submissions"]])
    lines += ["| part | method | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for part, ms in rows:
        for name, m in ms.items():
            lines.append(f"| {part} | {name} | " + " | ".join(f"{m[c]:.2f}" if c in m else "-" for c in cols) + " |")
    return "\n".join(lines + [f"submission: {p}" for p in results["submissions"]])
