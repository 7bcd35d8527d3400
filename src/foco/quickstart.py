"""`foco quickstart`: world -> backbone -> decompositions (oracle) -> FoCo training -> edit triplets -> foco-edits
-> evaluation, end to end.

The headline comparison is in the demo itself: FoCo (the paper's recipe), foco-edits (FoCo with a third stage on
rule-written edit triplets; not in the FoCo paper), slerp with its alpha chosen on the val split, and the simple
baselines. Every stage reuses what an earlier run left in the output folder, so a second run only re-evaluates.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path

from .backbones.world import PRETRAINED, VIT, load_world_backbone
from .benchmarks.base import CIRBenchmark
from .benchmarks.cache import PartFeatures
from .benchmarks.world import read_world
from .decompose import build_decomposer
from .decompose.inputs import read_captions
from .decompose.run import run_decompose
from .benchmarks.world import world_cache_features
from .eval.evaluate import EvalConfig, evaluate, label, val_parts
from .eval.figures import FigureRow, edit_type_chart, retrieval_figure
from .features import ExtractConfig
from .methods import DEFAULT_METHODS, MethodOptions
from .train.foco import train_foco
from .train.sources import TrainingData, training_data
from .train.recipes import QuickstartPlan, edit_triplets, quickstart_plan, train_stage3
from .train.world_backbone import train_world_backbone
from .utils.device import resolve_device
from .utils.io import atomic_write_text
from .utils.precision import resolve_precision
from .world.decompositions import world_decompositions
from .world.generate import generate_world, world_config
from .world.splits import extract_world_split

log = logging.getLogger(__name__)


def _stage(name: str):
    log.info("== %s", name)
    return time.time()


def run_quickstart(out: str | Path, size: str = "default", seed: int = 0, decomposer: str = "oracle",
                   train_backbone: bool = False, world_seed: int = 0, precision: str = "auto",
                   device: str = "auto", backbone: str = "vit") -> dict:
    """`decomposer` other than oracle (the paper's rule-based ablation) trains and evaluates into its own
    folders (features/train-<name>, foco-<name>, results-<name>.json) beside the oracle run, reusing the rest.

    The backbone (`backbone`: "vit", `world:vit`, or "cnn", `world:pretrained`) is one shipped with foco (trained by
    `foco backbone train` on the default world's pretrain split, seed 0; its sha256 is checked at load), as a user
    starts from pretrained CLIP weights. `train_backbone` trains one of that kind on this world instead, into
    `out`/backbone, with the shipped weights' training settings. `seed` seeds the training
    (FoCo, foco-edits, and the backbone when trained); `world_seed` seeds the world. `precision` ("auto": bf16 where
    the CPU has it natively, else fp32) applies to feature extraction and FoCo training; a trained backbone takes
    the shipped weights' own (their config.json's "precision", fp32 where absent). `device` ("auto": CUDA
    where present) runs the backbone and every training."""
    out = Path(out)
    suffix = "" if decomposer == "oracle" else f"-{decomposer}"
    plan = quickstart_plan(size)
    device = str(resolve_device(device))
    precision = resolve_precision(precision, device)
    if backbone not in QUICKSTART_BACKBONES:
        raise ValueError(f"quickstart backbone {backbone!r}: choose one of {', '.join(QUICKSTART_BACKBONES)}")
    shipped = QUICKSTART_BACKBONES[backbone]
    plan = replace(plan, backbone=replace(shipped_train_config(shipped, plan.backbone, schedule=size != "tiny"),
                                          seed=seed, device=device),
                   foco=replace(plan.foco, seed=seed, precision=precision, device=device))
    log.info("precision: %s (%s)", precision, "native bfloat16 on this CPU" if precision == "bf16" else
             "no native bfloat16 here")
    timings = {}
    t = _stage("world")
    world = out / "world"
    generate_world(world, world_config(size, seed=world_seed))
    timings["world_s"] = time.time() - t

    t = _stage("backbone" + (" (training)" if train_backbone else " (pretrained, shipped with foco)"))
    bb_dir = out / "backbone" if train_backbone else shipped
    if train_backbone and not (bb_dir / "metrics.json").is_file():
        train_world_backbone(world, bb_dir, plan.backbone)
    backbone = load_world_backbone(bb_dir, device)
    if backbone.cfg.image_tower != backbone_kind(shipped):
        raise ValueError(f"{bb_dir} holds a {backbone.cfg.image_tower} backbone, not the {backbone_kind(shipped)} "
                         f"--backbone asks for: choose another --out")
    _check_backbone(out / "backbone.json", backbone.spec)
    timings["backbone_s"] = time.time() - t

    t = _stage(f"decompositions ({decomposer})")
    store = out / "decompositions.sqlite"
    records = read_captions(world, split="train")
    run_decompose([r.caption for r in records], build_decomposer(decomposer, records), store, batch_size=256)
    decompositions = world_decompositions(world, "train", store, decomposer)
    timings["decompose_s"] = time.time() - t

    t = _stage("features")
    feats = out / "features"
    xcfg = ExtractConfig(precision=precision)
    extract_world_split(backbone, world, "train", feats / f"train{suffix}", xcfg, include_captions=False,
                        decompositions=decompositions)
    for split in (plan.benchmark_split, "val"):  # val: slerp's alpha is chosen there
        for protocol in ("single", "multi"):
            extract_world_split(backbone, world, f"{split}/{protocol}", feats / f"{split}-{protocol}", xcfg)
    timings["features_s"] = time.time() - t

    source = training_data(feats / f"train{suffix}", world, "train", store=store, decomposer=decomposer)
    t = _stage(f"FoCo training ({decomposer} decompositions)")
    foco_dir = out / f"foco{suffix}"
    if not (foco_dir / "foco.safetensors").is_file():
        table, _ = source.pair_table()
        train_foco(table, foco_dir, plan.foco, resume=True,
                   meta={"backbone": backbone.spec, "provenance": source.provenance()})
    timings["foco_train_s"] = time.time() - t

    t = _stage("edit triplets and foco-edits (a third stage, not in the FoCo paper)")
    edits_dir = out / f"foco-edits{suffix}"
    if not (edits_dir / "foco.safetensors").is_file() or not _has_stage3(edits_dir):
        train_foco_edits(out, suffix, source, decompositions, backbone, foco_dir, edits_dir, plan,
                         [r.id for r in records])
    timings["foco_edits_s"] = time.time() - t

    t = _stage("evaluation")
    results = evaluate_world(world, plan.benchmark_split, feats, foco_dir, out / f"figures{suffix}", plan.figures,
                             edits_dir, device)
    results = {"benchmark": f"world-{size}/{plan.benchmark_split}", "decomposer": decomposer, "seed": seed,
               "precision": precision, "backbone": backbone.spec, **results}
    timings["eval_s"] = time.time() - t
    t = _stage("search index of the test gallery (foco serve)")
    results["index"] = build_gallery_index(world, feats / f"{plan.benchmark_split}-single", out / "index",
                                           backbone, precision)
    timings["index_s"] = time.time() - t
    results["timings_s"] = {k: round(v, 1) for k, v in timings.items()}
    atomic_write_text(out / f"results{suffix}.json", json.dumps(results, indent=2) + "\n")
    return results


QUICKSTART_BACKBONES = {"vit": VIT, "cnn": PRETRAINED}  # --backbone -> the shipped weights' name


def backbone_kind(shipped: str) -> str:
    return "cnn" if shipped == PRETRAINED else "vit"


def shipped_train_config(shipped: str, base, schedule: bool = True):
    """The training settings the shipped weights were made with (their config.json's "train" and "config"), so that
    --train-backbone trains the same kind the same way. `schedule=False` keeps `base`'s epochs and batch size (the
    tiny world has too few pairs for the default world's schedule) and takes the rest."""
    from .backbones.world import WorldBackboneConfig, pretrained_dir
    from .utils.io import read_json
    meta = read_json(pretrained_dir(shipped) / "config.json")
    raw = dict(meta["config"])
    raw["widths"] = tuple(raw["widths"])
    train = meta.get("train") or {}
    names = ("lr", "weight_decay", "warmup_frac", "grad_clip") + (("epochs", "batch_size") if schedule else ())
    keep = {k: train[k] for k in names if k in train}
    return replace(base, **keep, precision=meta.get("precision", "fp32"), model=WorldBackboneConfig(**raw))


def build_gallery_index(world: Path, features: Path, out: Path, backbone, precision: str) -> str | None:
    """`foco index build` of the world's single-protocol test gallery, reusing the features already extracted for
    it, so that `foco serve --index OUT` works right after the demo. Skipped (None) without FAISS."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        log.info("FAISS is not installed: skipping the search index (pip install 'foco[serve]')")
        return None
    import numpy as np
    from .features import FeatureCache
    from .search.build import IndexConfig, build_index
    from .world.manifest import load_benchmark
    bench = load_benchmark(world, "test", "single")
    ids, feats = FeatureCache(features).images(patches=False)
    by_id = dict(zip(ids, feats.global_.numpy().astype(np.float32)))
    precomputed = {str(Path(p).resolve()): by_id[g] for g, p in zip(bench.gallery_ids, bench.gallery_images)}
    folder = Path(bench.gallery_images[0]).parent
    build_index(IndexConfig(images=str(folder), backbone=backbone.spec, precision=precision), out, backbone,
                precomputed=precomputed)
    return str(out)


def _check_backbone(record: Path, spec: str) -> None:
    """Every stage after the backbone reuses what the folder holds, so one folder serves one backbone: a rerun
    with or without --train-backbone against a folder made the other way is refused, not mixed."""
    if record.is_file():
        have = json.loads(record.read_text()).get("backbone")
        if have != spec:
            raise ValueError(f"{record.parent} was made with the backbone {have}, not {spec}: rerun with the "
                             "--backbone and --train-backbone it was made with, or choose another --out")
        return
    atomic_write_text(record, json.dumps({"backbone": spec}) + "\n")


def _has_stage3(folder: Path) -> bool:
    meta = folder / "foco.json"
    return meta.is_file() and "recipe" in json.loads(meta.read_text())


def train_foco_edits(out: Path, suffix: str, source: TrainingData, decompositions: dict, backbone, foco_dir: Path,
                     edits_dir: Path, plan: QuickstartPlan, ids: list[str]) -> None:
    """Rule-written ITT triplets of the training captions, their texts encoded once, then FoCo's third stage,
    resumed from the paper-recipe checkpoint (a copy of its folder, so the paper's stages are not rerun)."""
    table = edit_triplets(out / f"edits{suffix}.sqlite", out / "features" / f"edit-texts{suffix}", source.features,
                          decompositions, backbone, plan.edits, ids, plan.foco.precision)
    train_stage3(source.pair_table()[0], foco_dir, edits_dir, plan.foco, plan.edits, table, backbone.spec,
                 meta={"provenance": source.provenance()})


QUICKSTART_METHODS = ("foco", "foco-edits", "slerp", *(m for m in DEFAULT_METHODS if m != "foco"))


def evaluate_world(world: Path, split: str, features: Path, checkpoint: Path, figures: Path, n_figures: int,
                   foco_edits: Path | None = None, device: str = "cpu") -> dict:
    """FoCo, foco-edits (when given), slerp (alpha chosen on val) and the simple baselines on the world's `split`
    through the one evaluation path: {"protocols", "methods" (one row per method), "R@1_by_edit_type",
    "chosen_on_val" (slerp's alpha per protocol)}. Draws into `figures`: one query of each of `n_figures` edit
    types on `single` (a row per method, F_Aggr's attention for the FoCo rows, ground truths outlined) and the
    R@1-by-edit-type chart."""
    methods = tuple(m for m in QUICKSTART_METHODS if m != "foco-edits" or foco_edits is not None)
    cache = world_cache_features(features)
    cfg = EvalConfig(methods=methods, options=MethodOptions(checkpoint=checkpoint, foco_edits=foco_edits,
                                                            slerp_alpha="val", device=device),
                     by_category=True, val=val_parts(lambda: read_world(world, "val"), cache))
    answers: dict[str, dict[int, tuple[list[str], object]]] = {}  # method -> query -> (top-5 ids, attention)
    shown: list[int] = []

    def figure_hook(name: str, bench: CIRBenchmark, feats: PartFeatures, composed, rankings) -> None:
        if bench.name != "world/single":
            return
        if not shown:
            shown.extend(_one_query_per_type(bench, n_figures))
        answers[name] = {q: ([rankings.gallery_ids[i] for i in rankings.full[q, :5].tolist()],
                             composed.attention[q] if composed.attention is not None else None) for q in shown}

    bench = read_world(world, split)
    res = evaluate(bench, cache, cfg, on_ranked=figure_hook)
    single = next(b for b in bench if b.name == "world/single")
    by_type = {name: {t: round(v, 2) for t, v in per.items()}
               for name, per in res["parts"]["world/single"]["R@1_by_category"].items()}
    for q in shown:
        query = single.queries[q]
        rows = [FigureRow(label_of(name), [single.images[g].load() for g in top], [g in query.targets for g in top],
                          attention) for name, per in answers.items() for top, attention in [per[q]]]
        retrieval_figure(figures / f"{query.id}-{query.category}.png", single.images[query.reference].load(),
                         query.texts[0], rows, title=f"world {split}, query {query.id} ({query.category})")
    edit_type_chart(figures / "r1_by_edit_type.png", by_type, "R@1",
                    f"R@1 by edit type, world {split} (single protocol)")
    return {"protocols": {label(p): {"queries": e["queries"], "gallery": e["gallery"]}
                          for p, e in res["parts"].items()},
            "methods": res["methods"],
            "chosen_on_val": res["chosen"],
            "R@1_by_edit_type": by_type}


def label_of(method: str) -> str:
    return "FoCo" if method == "foco" else method


def _one_query_per_type(bench: CIRBenchmark, n: int) -> list[int]:
    """The first query of each of the first `n` edit types."""
    chosen, seen = [], set()
    for q, query in enumerate(bench.queries):
        if query.category not in seen:
            chosen.append(q)
            seen.add(query.category)
        if len(chosen) == n:
            break
    return chosen
