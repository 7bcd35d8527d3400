"""`foco eval`: every method on any benchmark through the one evaluation path.

    foco eval --benchmark {cirr,circo,fashioniq,genecis,world} --root PATH [--split val|test] --checkpoint DIR ...
    foco eval --benchmark world --root runs/world --features runs/features ...   # the caches `foco features
                                                                                 # extract` wrote

`--world W` is the old spelling of `--benchmark world --root W` (kept, with a deprecation note). Each reader
declares its own options (`READER.options` in foco.benchmarks.*); they are offered here for every benchmark and
refused for the others.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .rules import declare
from ..utils.parse import MAX_CHORD
from .common import (add_device_arg, add_owned_output, add_unverified_arg, check_writable, flag_dest, float_or_val,
                     positive_int)


def _reader_options(a: argparse.Namespace, name: str) -> dict:
    """The chosen reader's options; an option of another reader given a non-default value is an error."""
    from ..benchmarks import BENCHMARKS
    options = {}
    for other in BENCHMARKS.names():
        for opt in BENCHMARKS.get(other).options:
            value = getattr(a, flag_dest(opt.flag))
            if other == name:
                options[opt.name] = None if value is None else opt.parse(value)
            elif value != opt.default:
                raise ValueError(f"{opt.flag} is an option of --benchmark {other}, not {name}")
    return options


def _method_options(a: argparse.Namespace, methods: tuple[str, ...]) -> dict:
    """The methods' own options (`MethodOption`), parsed. A weights folder (an option with a record) is kept even
    for a method not evaluated: its record is checked, and it may name the backbone. Any other option of a method
    that is not evaluated, given a non-default value, is an error unless the option is not `strict`."""
    from ..methods import METHODS, declared_options
    for name in methods:
        METHODS.get(name)  # an unknown name is refused here, with the registered names
    values = {}
    for key, (opt, owners) in declared_options().items():
        value = getattr(a, flag_dest(opt.flag))
        if opt.record is None and not set(owners) & set(methods):
            if value != opt.default and opt.strict:
                raise ValueError(f"{opt.flag} is an option of method {', '.join(owners)}, which --methods does not "
                                 "name")
            if value is not None:
                opt.parse(value)  # a bad value is still an error
            continue
        if value is not None and not (opt.record and value == ""):  # an empty folder flag: not given
            values[key] = opt.parse(value)
    return values


def _target(a: argparse.Namespace) -> tuple[str, str, str]:
    """(benchmark, root, split), with `--world W` read as `--benchmark world --root W` (split test by default)."""
    if a.world:
        if a.benchmark or a.root:
            raise ValueError("give either --world (deprecated) or --benchmark with --root, not both")
        print("foco: note: --world W is deprecated; use --benchmark world --root W", file=sys.stderr)
        return "world", a.world, a.split or "test"
    if not a.benchmark or not a.root:
        raise ValueError("foco eval needs --benchmark NAME --root PATH (the dataset folder in its official layout)")
    if a.features and a.benchmark != "world":
        raise ValueError("--features (caches of `foco features extract`) is for --benchmark world; other benchmarks "
                         "cache their features under --cache")
    return a.benchmark, a.root, a.split or "val"


def _sources(a, name: str, root: str, split: str, options: dict, spec: str | None, backbone):
    """(features, val) sources: the world's extracted caches, or per-part caches encoded with the backbone."""
    from ..benchmarks import read_benchmark
    from ..benchmarks.world import world_cache_features
    from ..eval.evaluate import cached_features, val_parts
    from ..features import ExtractConfig
    if a.features:
        features = world_cache_features(Path(a.features))
        return features, val_parts(lambda: read_benchmark(name, root, "val", **options), features)
    if backbone is None:
        raise ValueError(f"--benchmark {name} encodes its images and needs --backbone (e.g. world:pretrained or "
                         "hf:PATH), or a trained method's folder that records one (--checkpoint, --pic2word, ...)")
    from ..benchmarks.cache import backbone_slug
    cache = Path(a.cache) if a.cache else Path("runs") / "cache" / f"{name}-{split}" / backbone_slug(spec)
    val_cache = cache if split == "val" else (Path(f"{a.cache}-val") if a.cache else
                                              Path("runs") / "cache" / f"{name}-val" / backbone_slug(spec))
    extract = ExtractConfig(batch_size=a.batch_size, out_flag="--cache", precision=a.precision)
    return (cached_features(backbone, cache, extract),
            val_parts(lambda: read_benchmark(name, root, "val", **options), cached_features(backbone, val_cache,
                                                                                            extract)))


def _eval(a: argparse.Namespace) -> int:
    from ..benchmarks import read_benchmark
    from ..eval.evaluate import EvalConfig, evaluate
    from ..eval.report import results_table
    from ..methods import MethodOptions, needs_text_tower
    from ..methods.provenance import recorded_spec
    from ..utils.io import atomic_write_text
    chord = float_or_val(a.chord, "--chord", 0.0, MAX_CHORD)  # a bad number is refused before anything runs
    name, root, split = _target(a)
    check_writable(a.out, "--out")
    _check_results_file(a.out, a.force)
    options = _reader_options(a, name)
    methods = tuple(a.methods.split(","))
    method_options = MethodOptions(unverified=a.unverified, **_method_options(a, methods))
    spec = a.backbone or recorded_spec(method_options)
    if a.features and not a.backbone:  # the features say what they were made with; a checkpoint is checked
        from ..benchmarks.world import world_features_backbone
        spec = world_features_backbone(Path(a.features), split, options.get("protocols")) or spec
    parts = read_benchmark(name, root, split, **options)  # every file checked before any encoding
    from ..utils.device import resolve_device
    device = str(resolve_device(a.device))  # the backbone, the methods' modules, composing and ranking run there
    backbone = None
    if spec and (not a.features or needs_text_tower(methods)):
        from ..backbones import create_backbone
        backbone = create_backbone(spec, device=device)
    features, val = _sources(a, name, root, split, options, spec, backbone)
    cfg = EvalConfig(methods=methods, chord=chord, chord_shortlist=a.chord_shortlist,
                     val=val, by_category=a.by_category,
                     options=method_options.replace(backbone=backbone, device=device),
                     submission_dir=Path(a.submission_dir or (Path(a.out).parent if a.out else
                                                              Path("runs") / "submissions")))
    results = evaluate(parts, features, cfg, backbone_spec=a.backbone if a.features else spec)
    print(results_table(results))
    if a.chord is not None:
        print("scores: Chord (cosine + lambda * direction agreement)")
    if a.out:
        atomic_write_text(a.out, json.dumps(results, indent=2) + "\n")
        print(f"results in {a.out}")
    return 0


def _check_results_file(out: str | None, force: bool) -> None:
    """--out replaces an earlier results file of `foco eval`, never another file, unless --force."""
    if not out or not Path(out).is_file():
        return
    try:
        mine = {"benchmark", "parts"} <= set(json.loads(Path(out).read_text()))
    except (ValueError, TypeError, UnicodeDecodeError):
        mine = False
    if not mine and not force:
        raise FileExistsError(f"--out {out} exists and is not a results file of `foco eval`; choose another --out, or "
                              "pass --force to replace it")


def register(sub: argparse._SubParsersAction) -> None:
    from ..benchmarks import BENCHMARKS
    from ..methods import METHODS, declared_options
    ev = sub.add_parser("eval", help="evaluate methods on a benchmark (official layouts, or the world)")
    ev.add_argument("--benchmark", default=None, choices=BENCHMARKS.names(),
                    help="read this benchmark from --root in its official layout (docs: foco.benchmarks)")
    ev.add_argument("--root", default=None, help="the dataset folder (a world folder for world)")
    ev.add_argument("--world", default=None, help="deprecated: --benchmark world --root WORLD (split test by default)")
    ev.add_argument("--split", default=None, choices=["val", "test"], help="default: val (test with --world)")
    ev.add_argument("--features", default=None,
                    help="world only: folder of <split>-<protocol> caches from `foco features extract`")
    ev.add_argument("--methods", default="foco,image,text,sum",
                    help=f"comma-separated, from: {', '.join(METHODS.names())}")
    ev.add_argument("--chord", default=None, metavar="LAMBDA",
                    help="Chord scoring with this lambda for every method, or 'val' to choose it per method on val")
    ev.add_argument("--chord-shortlist", type=positive_int, default=None,
                    help="Chord rescores only the cosine top-N of the gallery (default: all of it)")
    ev.add_argument("--by-category", action="store_true",
                    help="also R@1 per query category (world edit types, FashionIQ categories)")
    ev.add_argument("--backbone", default=None, help="backbone spec (default: the one the first trained method's "
                                                     "folder records, --checkpoint first)")
    ev.add_argument("--cache", default=None, help="feature cache folder (default runs/cache/<benchmark>-<split>/"
                                                  "<backbone>; val choices use <cache>-val)")
    for name in BENCHMARKS.names():
        for opt in BENCHMARKS.get(name).options:
            ev.add_argument(opt.flag, default=opt.default, choices=opt.choices, help=f"{name}: {opt.help}")
    for opt, owners in declared_options().values():  # each method's own: its weights folder, its settings
        ev.add_argument(opt.flag, default=opt.default, help=f"method {', '.join(owners)}: {opt.help}"
                        + (" (its record names the default --backbone)" if opt.record else ""))
    add_unverified_arg(ev)
    ev.add_argument("--submission-dir", default=None,
                    help="test splits of CIRR/CIRCO: where the server files go (default: beside --out, else "
                         "runs/submissions)")
    ev.add_argument("--batch-size", type=positive_int, default=128, help="images or texts per encoder call")
    ev.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"],
                    help="of the features encoded into --cache: fp32 (default), bf16 autocast, or auto (bf16 where "
                         "native); a cache keeps the precision it was made with")
    add_device_arg(ev)
    ev.add_argument("--out", default=None, help="write the results as JSON here")
    ev.add_argument("--force", action="store_true", help="--out may replace a file that is not a results file")
    add_owned_output(ev, dest="cache", signature=("*/manifest.json",))  # per-part caches, never a user's folder
    ev.set_defaults(func=_eval)
    weights = {w: "weights" for w in ("checkpoint", "foco_edits", "pic2word", "lincir", "searle", "context_i2w", "tat", "pact", "tscir", "adafocal")}
    declare(ev, reads={"root": "benchmark root", "world": "benchmark root", "features": "feature caches",
                       "backbone": "backbone", "genecis_coco": "images", "genecis_vg": "images", **weights},
            files=("out",), folders=("submission_dir",), evaluates=("root", "split"),
            values=("methods", "chord", "genecis_task", "protocols", "oacirr_domains", "pic2word_template",
                    "slerp_alpha"))
