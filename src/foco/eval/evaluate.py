"""The one evaluation path: for every benchmark part and every method, compose -> rank -> score.

    parts = read_benchmark("cirr", root, "val")
    results = evaluate(parts, cached_features(backbone, Path("runs/cache/cirr-val")),
                       EvalConfig(methods=("foco", "sum"), options=MethodOptions(checkpoint=ckpt)))

The embedded world is a benchmark like the others; its parts can also read the caches that `foco features extract`
wrote (`foco.benchmarks.world.world_cache_features`, a `FeatureSource` like `cached_features`). Chord rescoring
is an option of ranking; slerp's alpha and Chord's lambda can be chosen on the val split of the same benchmark
("val"), through `EvalConfig.val`, a second source of parts.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Union

from ..benchmarks.base import CIRBenchmark
from ..benchmarks.cache import PartFeatures, cache_part, load_part, part_folder
from ..features import ExtractConfig
from ..backbones import check_same_backbone
from ..methods import DEFAULT_METHODS, METHODS, MethodOptions, QueryMethod, build_method
from ..methods.base import MethodOption
from ..methods.provenance import check_trained_on, unverified
from ..model.encoder import ComposedQuery
from .compose import compose, reference_rows
from .rank import Chord, Rankings, rank, score, score_by_category
from .select import choose_lambda, choose_on_val
from .submission import write_submission

log = logging.getLogger(__name__)

FeatureSource = Callable[[CIRBenchmark], PartFeatures]
ValSource = Callable[[], dict[str, tuple[CIRBenchmark, PartFeatures]]]  # part name -> val part and its features
Choice = Union[float, str, None]  # a number, "val" (chosen on the val split) or None (off)
OnRanked = Callable[[str, CIRBenchmark, PartFeatures, ComposedQuery, Rankings], None]


@dataclass
class EvalConfig:
    methods: tuple[str, ...] = DEFAULT_METHODS
    options: MethodOptions = field(default_factory=MethodOptions)  # the methods' options (slerp_alpha "val":
    # chosen on val) and the backbone
    chord: Choice = None  # Chord rescoring lambda for every method: None (cosine), a number, or "val" (per method)
    chord_shortlist: int | None = None  # rescore only the cosine top-N of the full gallery (None: all of it)
    compose_batch: int = 256  # queries per method.encode call
    by_category: bool = False  # also R@1 per query category (world edit types) where there are categories
    submission_dir: Path | None = None  # where test-split submission files go (None: not written)
    val: ValSource | None = None  # val parts, for the choices made on val


def cached_features(backbone, cache: Path, extract: ExtractConfig = ExtractConfig()) -> FeatureSource:
    """Parts' features from `cache`/<part>/, encoding with `backbone` whatever is not cached yet."""
    def source(bench: CIRBenchmark) -> PartFeatures:
        folder = part_folder(cache, bench)
        log.info("%s: %d queries, %d gallery images; features in %s", bench.name, len(bench.queries),
                 len(bench.gallery_ids()), folder)
        cache_part(backbone, bench, folder, extract)
        return load_part(bench, folder)
    return source


def val_parts(read_val: Callable[[], list[CIRBenchmark]], features: FeatureSource) -> ValSource:
    """A `ValSource` that reads the val parts and their features once, on first use."""
    loaded: dict[str, tuple[CIRBenchmark, PartFeatures]] = {}

    def source() -> dict[str, tuple[CIRBenchmark, PartFeatures]]:
        if not loaded:
            loaded.update({b.name: (b, features(b)) for b in read_val()})
        return loaded
    return source


def label(part: str) -> str:
    """The short name of a part in reports: "single" for world/single, "dress" for fashioniq/dress."""
    return part.rsplit("/", 1)[-1]


def evaluate(parts: list[CIRBenchmark], features: FeatureSource, cfg: EvalConfig, backbone_spec: str | None = None,
             on_ranked: OnRanked | None = None) -> dict:
    """Results of every method on every part, with the parameters chosen on val, the mean over parts (when they
    share metrics), one row per method across parts (when they do not) and the paths of submission files.

    `on_ranked(method, bench, feats, composed, rankings)` is called after each method is ranked on each part
    (figures, exports)."""
    results: dict = {"benchmark": parts[0].name.split("/")[0], "split": parts[0].split, "backbone": backbone_spec,
                     "checkpoint": str(cfg.options.get("checkpoint")) if cfg.options.get("checkpoint") else None,
                     "options": parts[0].options, "parts": {}, "chosen": {}, "submissions": []}
    on_val = {n: [o for o in METHODS.get(n).options if o.on_val(cfg.options)] for n in cfg.methods}
    if cfg.options.backbone is not None and backbone_spec is not None:
        check_same_backbone(cfg.options.backbone, "the text tower", backbone_spec, "--backbone",
                            "build both from one spec")
    if cfg.options.unverified and unverified(cfg.options):
        results["unverified"] = unverified(cfg.options)  # used unchecked: the report says so
    fixed = {n: build_method(n, opts=cfg.options) for n in cfg.methods if not on_val[n]}  # else built per part
    first: list = []  # the first part's features: every other part's were made with the same backbone
    try:
        for bench in parts:
            feats = features(bench)
            _check_provenance(bench, feats, cfg, backbone_spec)
            what = f"the features of {bench.name} {bench.split}"
            if first:
                check_same_backbone(feats.backbone, what, first[0], first[1],
                                    "extract every part's features with one backbone")
            else:
                first[:] = [feats.backbone, what]
            if feats.backbone and feats.backbone.get("spec"):
                results["backbone"] = feats.backbone["spec"]  # what the numbers were computed on
            entry = {"queries": len(bench.queries), "gallery": len(bench.gallery_ids()), "discarded": bench.discarded,
                     "methods": {}}
            for key in ("described_share", "restaged_strength"):  # the protocol's text and pictures: what the
                if key in bench.source:                                # numbers mean
                    entry[key] = bench.source[key]
            for name in cfg.methods:
                method = fixed.get(name) or _chosen_on_val(name, on_val[name], bench, cfg, results["chosen"])
                composed = compose(method, bench, feats, cfg.compose_batch)
                rankings = rank(bench, feats.gallery_ids, feats.gallery, composed.query,
                                _chord(name, method, bench, feats, cfg, results["chosen"]))
                entry["methods"][name] = score(bench, rankings)
                if cfg.by_category:
                    by_cat = score_by_category(bench, rankings)
                    if by_cat:
                        entry.setdefault("R@1_by_category", {})[name] = by_cat
                if not bench.has_targets and bench.protocol.submission and cfg.submission_dir is not None:
                    paths = write_submission(cfg.submission_dir, bench, rankings, name)
                    results["submissions"] += [str(p) for p in paths]
                if on_ranked is not None:
                    on_ranked(name, bench, feats, composed, rankings)
            results["parts"][bench.name] = entry
    finally:
        for method in fixed.values():
            method.close()
    if results["chosen"] and results["split"] == "val":
        from .report import CHOSEN_ON_SCORED_SPLIT
        results["chosen_on_scored_split"] = CHOSEN_ON_SCORED_SPLIT
    averaged = all(b.protocol.parts_averaged for b in parts)
    mean = mean_over_parts(results["parts"]) if averaged else {}
    if mean:
        results["mean"] = mean
    merged = merge_parts(results["parts"], side_by_side=not averaged)
    if merged:
        results["methods"] = merged
    return results


def _check_provenance(bench: CIRBenchmark, feats: PartFeatures, cfg: EvalConfig, backbone_spec: str | None) -> None:
    """The features of `bench` were made with the backbone the user named (`backbone_spec`), the text tower the
    methods re-encode with, and the one every trained method was trained on; else refused, naming both."""
    if not feats.backbone or not feats.backbone.get("spec"):
        return
    what = f"the features of {bench.name} {bench.split}"
    if backbone_spec is not None:
        check_same_backbone(backbone_spec, "--backbone", feats.backbone, what,
                            f"pass --backbone {feats.backbone['spec']} (or leave it out), or features made with "
                            f"{backbone_spec}")
    if cfg.options.backbone is not None:
        check_same_backbone(cfg.options.backbone, "the text tower", feats.backbone, what,
                            f"pass --backbone {feats.backbone['spec']}")
    check_trained_on(cfg.options, feats.backbone, what, "use features made with the backbone it records")


def _val_part(bench: CIRBenchmark, cfg: EvalConfig, what: str, flag: str) -> tuple[CIRBenchmark, PartFeatures]:
    """The val split's part of `bench` to choose `what` on (`flag`: the number to pass instead, e.g. "--chord
    0.5"), checked to be written as `bench` was."""
    if cfg.val is None:
        raise ValueError(f"choosing {what} on val needs the val split's features; pass {flag} instead of 'val'")
    try:
        val = cfg.val()
    except (FileNotFoundError, ValueError) as exc:  # e.g. an exported folder that holds the test split only
        raise ValueError(f"choosing {what} on val needs the val split of this benchmark, which cannot be read "
                         f"({exc}); pass a number instead of 'val' ({flag}: the value chosen on val elsewhere), or "
                         f"give a --root that holds the val split too") from None
    if bench.name not in val:
        raise ValueError(f"the val split has no part {bench.name!r} to choose {what} on")
    for key, command in (("described_share", "describe --share S"), ("restaged_strength", "restage --strength S")):
        have, want = val[bench.name][0].source.get(key), bench.source.get(key)
        if have != want:
            name = key.replace("_", " ")
            raise ValueError(f"choosing {what} on val: val's {bench.name} was written at {name} {have}, "
                             f"{bench.split}'s at {want}; rerun `foco world {command}` for both splits")
    _check_provenance(*val[bench.name], cfg, None)
    return val[bench.name]


def _chosen_on_val(name: str, options: list[MethodOption], bench: CIRBenchmark, cfg: EvalConfig,
                   chosen: dict) -> QueryMethod:
    """Method `name` built with each of its `options` given as "val" chosen on `bench`'s val part, in order."""
    opts = cfg.options
    for option in options:
        what = f"{name}'s {option.flag}"
        value, _ = choose_on_val(name, option, opts, *_val_part(bench, cfg, what, f"{option.flag} 0.5"))
        opts = opts.replace(**{option.name: value})
        chosen[f"{option.name.replace('_', ' ')} ({label(bench.name)})"] = value
    return build_method(name, opts=opts)


def _chord(name: str, method: QueryMethod, bench: CIRBenchmark, feats: PartFeatures, cfg: EvalConfig,
           chosen: dict) -> Chord | None:
    if cfg.chord is None:
        return None
    lam = cfg.chord
    if lam == "val":
        vb, vf = _val_part(bench, cfg, "Chord's lambda", "--chord 0.5")
        lam, _ = choose_lambda(compose(method, vb, vf, cfg.compose_batch).query, vb, vf)
        chosen[f"chord lambda {name} ({label(bench.name)})"] = lam
    refs = feats.references.global_[reference_rows(bench, feats)].float()  # (Q, D)
    return Chord(float(lam), refs, cfg.chord_shortlist)


def mean_over_parts(parts: dict) -> dict[str, dict[str, float]]:
    """Unweighted mean over parts (FashionIQ categories, GeneCIS tasks), when there are several with the same
    metrics; empty otherwise. Only for parts whose protocol says they are averaged (`EvalProtocol.parts_averaged`)."""
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


def merge_parts(parts: dict, side_by_side: bool = False) -> dict[str, dict[str, float]]:
    """One row per method across parts whose metrics have different names (the world's single and multi, or a
    single part); empty when two parts report the same metric (their mean is `mean_over_parts`), unless the parts
    are protocols reported `side_by_side` (`EvalProtocol.parts_averaged` False): then the later part's shared
    metrics are labelled with its name."""
    out: dict[str, dict[str, float]] = {}
    for part, entry in parts.items():
        for name, metrics in entry["methods"].items():
            row = out.setdefault(name, {})
            if row.keys() & metrics.keys():
                if not side_by_side:
                    return {}
                # e.g. the world's single and described share metric names: the later protocol's are labelled
                metrics = {f"{k} ({label(part)})": v for k, v in metrics.items()}
            row.update(metrics)
    return out
