"""The `foco` command line: one subcommand per pipeline stage. Parse -> typed config -> call the library."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path


def _world_generate(a: argparse.Namespace) -> int:
    from .world.generate import generate_world, world_config
    cfg = world_config(a.size, seed=a.seed, stamps_dir=a.stamps, partial_captions=not a.exhaustive_captions)
    out = Path(a.out)
    t0 = time.time()
    summary = generate_world(out, cfg)
    print(f"world written to {out} in {time.time() - t0:.1f}s")
    for name, n in summary["counts"].items():
        print(f"  {name}: {n}")
    return 0


def _world_verify(a: argparse.Namespace) -> int:
    from .world.verify import verify_world
    report = verify_world(a.world)
    print(json.dumps(report, indent=2))
    return 0


def _backbone_train(a: argparse.Namespace) -> int:
    from .backbones.train_world import BackboneTrainConfig, train_world_backbone
    cfg = BackboneTrainConfig(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, seed=a.seed, threads=a.threads)
    metrics = train_world_backbone(a.world, a.out, cfg, resume=not a.no_resume)
    _print_table("world backbone on backbone_val", metrics)
    print(f"saved to {a.out} (model.safetensors + config.json); use it as --backbone world:{a.out}")
    return 0


def _backbone_eval(a: argparse.Namespace) -> int:
    from .backbones import create_backbone
    from .backbones.train_world import evaluate_backbone
    metrics = evaluate_backbone(create_backbone(a.backbone), Path(a.world), a.split)
    _print_table(f"{a.backbone} on {a.split}", metrics)
    return 0


def _features_extract(a: argparse.Namespace) -> int:
    from .backbones import create_backbone
    from .features import ExtractConfig
    from .world.splits import extract_world_split
    cfg = ExtractConfig(shard_size=a.shard_size, batch_size=a.batch_size, dtype=a.dtype, patches=not a.no_patches)
    decs = None
    if a.decompositions is not None:
        from .decompose.world import world_decompositions
        decs = world_decompositions(a.world, a.split, a.decompositions, a.decomposer)
    stats = extract_world_split(create_backbone(a.backbone), a.world, a.split, a.out, cfg, decompositions=decs)
    for kind, s in stats.items():
        rate = f"{s['encoded'] / s['seconds']:.1f}/s" if s["encoded"] else "all cached"
        print(f"{kind}: {s['items']} items, {s['encoded']} encoded now ({rate})")
    print(f"features in {a.out}")
    return 0


def _train(a: argparse.Namespace) -> int:
    from .data import build_pair_table
    from .model import FoCoConfig
    from .train import FoCoTrainConfig, train_foco
    from .decompose.world import world_decompositions
    from .utils.io import read_json
    cfg = FoCoTrainConfig(stage1_epochs=a.stage1_epochs, stage2_epochs=a.stage2_epochs, batch_size=a.batch_size,
                          lr_stage1=a.lr_stage1, lr_aggr=a.lr_aggr, lr_comp=a.lr_comp,
                          max_negatives=a.max_negatives, seed=a.seed,
                          model=FoCoConfig(learn_bias=a.learn_bias))
    decompositions = world_decompositions(a.world, a.split, a.decompositions, a.decomposer)
    table = build_pair_table(a.features, decompositions)
    backbone = read_json(Path(a.features) / "manifest.json")["backbone"]
    train_foco(table, a.out, cfg, resume=a.resume, meta={"backbone": backbone})
    print(f"FoCo checkpoint in {a.out} (foco.safetensors + foco.json); log {a.out}/train_log.jsonl, "
          f"curve {a.out}/loss_curve.png")
    return 0


def _eval(a: argparse.Namespace) -> int:
    if a.benchmark:
        return _eval_benchmark(a)
    if not a.world or not a.features:
        raise ValueError("foco eval needs --benchmark NAME --root PATH, or --world WORLD --features DIR")
    from .compare import MethodOptions, compare_methods
    from .quickstart import results_table
    split = a.split or "test"
    opts = MethodOptions(checkpoint=a.checkpoint, pic2word=a.pic2word, backbone=_backbone_spec(a),
                         slerp_alpha=_float_or_val(a.slerp_alpha), chord=_float_or_val(a.chord))
    results = compare_methods(a.world, split, a.features, a.methods.split(","), opts, tuple(a.protocols.split(",")))
    print(results_table(results))
    for what, value in results["chosen"].items():
        print(f"chosen on val: {what} = {value}")
    if a.chord is not None:
        print("scores: Chord (cosine + lambda * direction agreement)")
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _backbone_spec(a: argparse.Namespace) -> str | None:
    """--backbone, else the backbone a FoCo checkpoint records (foco.json)."""
    if a.backbone is None and a.checkpoint:
        from .utils.io import read_json
        return read_json(Path(a.checkpoint) / "foco.json").get("backbone")
    return a.backbone


def _float_or_val(v: str | None) -> float | str | None:
    if v is None or v == "val":
        return v
    try:
        return float(v)
    except ValueError:
        raise ValueError(f"expected a number or 'val', got {v!r}") from None


def _pic2word_train(a: argparse.Namespace) -> int:
    from .backbones import create_backbone
    from .features import FeatureCache
    from .methods import Pic2WordTrainConfig, train_pic2word
    from .utils.io import read_json
    spec = a.backbone or read_json(Path(a.features) / "manifest.json")["backbone"]
    _, images = FeatureCache(a.features).images()
    cfg = Pic2WordTrainConfig(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, seed=a.seed)
    train_pic2word(images.global_, create_backbone(spec), a.out, cfg, resume=True)
    print(f"Pic2Word mapper in {a.out}; use it with foco eval --methods pic2word --pic2word {a.out}")
    return 0


def _world_ambiguous(a: argparse.Namespace) -> int:
    from .world.ambiguous import generate_ambiguous_split, split_name
    summary = generate_ambiguous_split(a.world, a.split, n_queries=a.queries, out=a.out)
    print(f"ambiguous benchmark {split_name(a.split)}/single written under {a.out or a.world}: "
          f"{summary['queries']} queries, {summary['gallery']} gallery images, boxes as {summary['box_format']}")
    return 0


def _eval_benchmark(a: argparse.Namespace) -> int:
    """`foco eval --benchmark NAME --root PATH`: an official-format benchmark (or the world) from its files."""
    from .backbones import create_backbone
    from .benchmarks import read_benchmark
    from .benchmarks.cache import backbone_slug
    from .benchmarks.run import EvalConfig, evaluate_parts, results_table
    from .features import ExtractConfig
    from .utils.io import atomic_write_text
    if not a.root:
        raise ValueError("--benchmark needs --root, the dataset folder in its official layout")
    split = a.split or "val"
    backbone_spec = _backbone_spec(a)
    if not backbone_spec:
        raise ValueError("--benchmark needs --backbone (e.g. world:runs/quickstart/backbone or hf:PATH)")
    options: dict = {}
    if a.benchmark == "fashioniq":
        options["join"] = a.fashioniq_join
    elif a.benchmark == "genecis":
        from .benchmarks.genecis import TASKS
        options.update(tasks=TASKS if a.genecis_task == "all" else tuple(a.genecis_task.split(",")),
                       coco_dir=a.genecis_coco, vg_dir=a.genecis_vg)
    parts = read_benchmark(a.benchmark, a.root, split, **options)  # every file checked before any encoding
    cache = Path(a.cache or Path("runs") / "cache" / f"{a.benchmark}-{split}" / backbone_slug(backbone_spec))
    submissions = Path(a.submission_dir or (Path(a.out).parent if a.out else Path("runs") / "submissions"))
    chord = _float_or_val(a.chord)
    if chord == "val":
        raise ValueError("with --benchmark, give Chord's lambda as a number (choose it on a val split first)")
    alpha = _float_or_val(a.slerp_alpha)
    if alpha == "val" and "slerp" in a.methods.split(","):
        raise ValueError("with --benchmark, give slerp's alpha as a number (choose it on the val split first)")
    cfg = EvalConfig(methods=tuple(a.methods.split(",")), checkpoint=Path(a.checkpoint) if a.checkpoint else None,
                     cache=cache, submission_dir=submissions,
                     extract=ExtractConfig(batch_size=a.batch_size),
                     pic2word=Path(a.pic2word) if a.pic2word else None,
                     slerp_alpha=0.5 if alpha == "val" else float(alpha),
                     chord=float(chord or 0.0))
    results = evaluate_parts(parts, create_backbone(backbone_spec, device=a.device), cfg)
    print(results_table(results))
    print(f"\nfeatures cached in {cache}")
    if a.out:
        atomic_write_text(a.out, json.dumps(results, indent=2) + "\n")
        print(f"results in {a.out}")
    return 0


def _world_export(a: argparse.Namespace) -> int:
    from .benchmarks.export import export_world
    summary = export_world(a.world, a.format, a.split, a.out)
    print(f"world {a.split} ({summary['protocol']}) written to {a.out} in the {a.format} layout: "
          f"{summary['queries']} queries, {summary['gallery']} gallery images")
    print(f"evaluate it with: foco eval --benchmark {a.format} --root {a.out} --split "
          f"{'val' if a.format == 'genecis' else a.split} --backbone ... --checkpoint ...")
    return 0


def _quickstart(a: argparse.Namespace) -> int:
    from .quickstart import results_table, run_quickstart
    t0 = time.time()
    results = run_quickstart(a.out, a.size, a.seed, a.decomposer)
    print(results_table(results))
    suffix = "" if a.decomposer == "oracle" else f"-{a.decomposer}"
    print(f"\nresults in {a.out}/results{suffix}.json, figures in {a.out}/attention{suffix}/ "
          f"({time.time() - t0:.0f}s)")
    return 0


def _decompose(a: argparse.Namespace) -> int:
    from .decompose import build_decomposer
    from .decompose.client import ChatConfig
    from .decompose.inputs import read_captions
    from .decompose.llm import LLMConfig
    from .decompose.run import run_decompose
    records = read_captions(a.inp, split=a.split)
    if a.limit:
        records = records[:a.limit]
    llm = None
    if a.decomposer == "llm":
        llm = LLMConfig(ChatConfig(url=a.llm_url or "", model=a.llm_model or "", api_key=a.llm_key or "",
                                   timeout_s=a.timeout, max_tokens=a.max_tokens, json_mode=a.json_mode),
                        min_pairs=a.min_pairs, max_pairs=a.max_pairs, max_retries=a.retries,
                        concurrency=a.concurrency, backoff_s=a.backoff)
    decomposer = build_decomposer(a.decomposer, records, llm, max_pairs=a.max_pairs)
    try:
        stats = run_decompose([r.caption for r in records], decomposer, a.out, batch_size=a.batch_size)
    finally:
        if hasattr(decomposer, "close"):
            decomposer.close()
    print(stats.summary())
    print(f"store: {a.out} (decomposer settings id {stats.settings_id}); "
          f"train with --decompositions {a.out} --decomposer {a.decomposer}")
    return 0


def _decomposition_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--decompositions", default=None,
                   help="SQLite store written by `foco decompose` (default: the world's oracle decompositions)")
    p.add_argument("--decomposer", default="oracle",
                   help="which decomposer's results to read from the store: a name or a settings id")


def _print_table(title: str, metrics: dict) -> None:
    print(f"\n| {title} | value |\n|---|---|")
    for k, v in metrics.items():
        print(f"| {k} | {v:.2f} |" if isinstance(v, float) else f"| {k} | {v} |")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="foco", description="Focus-then-Complete zero-shot composed image retrieval")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", required=True)

    world = sub.add_parser("world", help="the embedded synthetic world").add_subparsers(dest="action", required=True)
    g = world.add_parser("generate", help="generate images, caption pairs and CIR benchmarks")
    g.add_argument("--out", required=True, help="output folder")
    g.add_argument("--size", default="default", choices=["tiny", "default"])
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--stamps", default=None,
                   help="folder of captioned cutout PNGs (tuxpaint-stamps layout) to use as extra objects")
    g.add_argument("--exhaustive-captions", action="store_true",
                   help="every training caption names every object and the background (default: some are partial)")
    g.set_defaults(func=_world_generate)
    am = world.add_parser("ambiguous", help="the ambiguous-reference variant (two same-kind objects, a box)")
    am.add_argument("--world", required=True)
    am.add_argument("--split", default="test", choices=["val", "test"])
    am.add_argument("--queries", type=int, default=None)
    am.add_argument("--out", default=None, help="root to write under (default: the world folder)")
    am.set_defaults(func=_world_ambiguous)
    v = world.add_parser("verify", help="check every manifest and image of a world folder")
    v.add_argument("world")
    v.set_defaults(func=_world_verify)
    ex = world.add_parser("export", help="write a world benchmark in an official layout (CIRR, CIRCO, ...)")
    ex.add_argument("--world", required=True)
    ex.add_argument("--format", required=True, choices=["cirr", "circo", "fashioniq", "genecis"])
    ex.add_argument("--split", default="val", choices=["val", "test"],
                    help="test files carry no targets, as the official ones (GeneCIS keeps them)")
    ex.add_argument("--out", required=True)
    ex.set_defaults(func=_world_export)

    bb = sub.add_parser("backbone", help="the world backbone").add_subparsers(dest="action", required=True)
    t = bb.add_parser("train", help="pretrain the world backbone contrastively on the pretrain split")
    t.add_argument("--world", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--epochs", type=int, default=6)
    t.add_argument("--batch-size", type=int, default=256)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    t.add_argument("--no-resume", action="store_true", help="start over even if a training state exists")
    t.set_defaults(func=_backbone_train)
    e = bb.add_parser("eval", help="caption<->image retrieval of a backbone on a pairs split")
    e.add_argument("--backbone", required=True, help="e.g. world:runs/backbone or hf:PATH")
    e.add_argument("--world", required=True)
    e.add_argument("--split", default="backbone_val")
    e.set_defaults(func=_backbone_eval)

    feats = sub.add_parser("features", help="the feature cache").add_subparsers(dest="action", required=True)
    x = feats.add_parser("extract", help="encode a world split once into resumable shards")
    x.add_argument("--backbone", required=True)
    x.add_argument("--world", required=True)
    x.add_argument("--split", required=True,
                   help="a pairs split (pretrain, train, backbone_val) or a benchmark (val/single, test/multi, ...)")
    x.add_argument("--out", required=True)
    x.add_argument("--shard-size", type=int, default=2048)
    x.add_argument("--batch-size", type=int, default=128)
    x.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    x.add_argument("--no-patches", action="store_true", help="store only global image features")
    _decomposition_args(x)
    x.set_defaults(func=_features_extract)

    tr = sub.add_parser("train", help="train FoCo (stage 1: F_Aggr; stage 2: F_Aggr + F_Comp) on cached features")
    tr.add_argument("--features", required=True, help="feature cache of the training split")
    tr.add_argument("--world", required=True, help="world folder (its pairs; oracle decompositions by default)")
    tr.add_argument("--split", default="train")
    _decomposition_args(tr)
    tr.add_argument("--out", required=True)
    tr.add_argument("--stage1-epochs", type=int, default=3)
    tr.add_argument("--stage2-epochs", type=int, default=30)
    tr.add_argument("--batch-size", type=int, default=512)
    tr.add_argument("--lr-stage1", type=float, default=5e-4)
    tr.add_argument("--lr-aggr", type=float, default=5e-5)
    tr.add_argument("--lr-comp", type=float, default=3e-5)
    tr.add_argument("--max-negatives", type=int, default=None, help="cap on cross-instance negatives per anchor")
    tr.add_argument("--learn-bias", action="store_true", help="learnable logit bias (off = paper-exact)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--resume", action="store_true", help="continue the run in --out")
    tr.set_defaults(func=_train)

    ev = sub.add_parser("eval", help="evaluate methods on a benchmark (official formats, or the world's caches)")
    ev.add_argument("--benchmark", default=None, choices=["fashioniq", "cirr", "circo", "genecis", "world"],
                    help="read this benchmark from --root in its official layout (docs: foco.benchmarks)")
    ev.add_argument("--root", default=None, help="with --benchmark: the dataset folder (a world folder for world)")
    ev.add_argument("--world", default=None, help="without --benchmark: a world folder, evaluated from --features")
    ev.add_argument("--split", default=None, choices=["val", "test"],
                    help="default: val with --benchmark, test with --world")
    ev.add_argument("--features", default=None, help="without --benchmark: folder holding <split>-<protocol> caches")
    ev.add_argument("--protocols", default="single,multi", help="without --benchmark: world protocols")
    ev.add_argument("--methods", default="foco,image,text,sum",
                    help="comma-separated: foco, pic2word, slerp, sum, image, text (world benchmarks: all six)")
    ev.add_argument("--pic2word", default=None, help="Pic2Word mapper folder (foco pic2word train)")
    ev.add_argument("--slerp-alpha", default="val", help="slerp's alpha, or 'val' to choose it on val features")
    ev.add_argument("--chord", default=None, metavar="LAMBDA",
                    help="Chord scoring with this lambda for every method, or 'val' to choose it per method on val")
    ev.add_argument("--checkpoint", default=None, help="FoCo checkpoint folder")
    ev.add_argument("--backbone", default=None,
                    help="with --benchmark: backbone spec (default: the one recorded in the FoCo checkpoint)")
    ev.add_argument("--cache", default=None,
                    help="with --benchmark: feature cache folder (default runs/cache/<benchmark>-<split>/<backbone>)")
    ev.add_argument("--fashioniq-join", default="both", choices=["both", "single", "pic2word"],
                    help="how FashionIQ's two captions become query text")
    ev.add_argument("--genecis-task", default="all",
                    help="all, or comma-separated of focus_attribute,change_attribute,focus_object,change_object")
    ev.add_argument("--genecis-coco", default=None, help="GeneCIS object-task images (default ROOT/val2017)")
    ev.add_argument("--genecis-vg", default=None, help="GeneCIS attribute-task images (default ROOT/VG_100K_all)")
    ev.add_argument("--submission-dir", default=None,
                    help="test splits of CIRR/CIRCO: where the server files go (default: beside --out, else "
                         "runs/submissions)")
    ev.add_argument("--batch-size", type=int, default=128, help="images or texts per encoder call")
    ev.add_argument("--device", default="cpu")
    ev.add_argument("--out", default=None, help="write the results as JSON here")
    ev.set_defaults(func=_eval)

    dc = sub.add_parser("decompose", help="decompose captions into (local, context) pairs into a SQLite store")
    dc.add_argument("--in", dest="inp", required=True,
                    help="CSV / TSV / JSONL of captions (CC3M-style url<TAB>caption works), or a world folder")
    dc.add_argument("--out", required=True, help="SQLite store (created or resumed)")
    dc.add_argument("--decomposer", default="oracle", choices=["oracle", "rule", "llm"])
    dc.add_argument("--split", default="train", help="with a world folder: which pairs split")
    dc.add_argument("--limit", type=int, default=None, help="only the first N captions")
    dc.add_argument("--batch-size", type=int, default=64, help="captions per store transaction")
    dc.add_argument("--min-pairs", type=int, default=3, help="fewest pairs an LLM answer may give")
    dc.add_argument("--max-pairs", type=int, default=5, help="most pairs (LLM answers; rule keeps the first)")
    llm = dc.add_argument_group("llm (an OpenAI-compatible chat-completions server)")
    llm.add_argument("--llm-url", default=None, help="base URL, e.g. http://127.0.0.1:8000/v1 (env FOCO_LLM_URL)")
    llm.add_argument("--llm-model", default=None, help="model name (env FOCO_LLM_MODEL)")
    llm.add_argument("--llm-key", default=None, help="API key (env FOCO_LLM_API_KEY or OPENAI_API_KEY)")
    llm.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    llm.add_argument("--retries", type=int, default=3, help="retries per caption before the rule fallback")
    llm.add_argument("--backoff", type=float, default=1.0, help="first retry wait in seconds (doubles)")
    llm.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    llm.add_argument("--max-tokens", type=int, default=400)
    llm.add_argument("--json-mode", action="store_true", help="request response_format json_object")
    dc.set_defaults(func=_decompose)

    pw = sub.add_parser("pic2word", help="the Pic2Word baseline").add_subparsers(dest="action", required=True)
    pt = pw.add_parser("train", help="train Pic2Word's mapping network on cached image features")
    pt.add_argument("--features", required=True, help="feature cache of the training split (its images)")
    pt.add_argument("--out", required=True)
    pt.add_argument("--backbone", default=None, help="default: the backbone recorded in the feature cache")
    pt.add_argument("--epochs", type=int, default=2)
    pt.add_argument("--batch-size", type=int, default=128)
    pt.add_argument("--lr", type=float, default=5e-4)
    pt.add_argument("--seed", type=int, default=0)
    pt.set_defaults(func=_pic2word_train)

    qs = sub.add_parser("quickstart", help="world -> backbone -> decompositions -> FoCo -> evaluation")
    qs.add_argument("--out", required=True)
    qs.add_argument("--size", default="default", choices=["tiny", "default"])
    qs.add_argument("--seed", type=int, default=0)
    qs.add_argument("--decomposer", default="oracle", choices=["oracle", "rule"],
                    help="training decompositions; rule (spaCy) is the paper's ablation and trains beside oracle")
    qs.set_defaults(func=_quickstart)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is fetched at run time unless the user says so
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from .utils.io import ImageLoadError, ManifestError
    try:
        return args.func(args)
    except (ManifestError, ImageLoadError, FileNotFoundError, FileExistsError, ValueError, ImportError) as exc:
        print(f"foco: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # e.g. the LLM server refusing the configuration
        if type(exc).__name__ != "ConfigError":
            raise
        print(f"foco: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("foco: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
