"""`foco quickstart`: world -> backbone -> decompositions (oracle) -> FoCo training -> evaluation, end to end.

Every stage reuses what an earlier run left in the output folder, so a second run only re-evaluates.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from .backbones.world import load_world_backbone
from .benchmarks.base import CIRBenchmark
from .benchmarks.cache import PartFeatures
from .benchmarks.world import read_world
from .decompose import build_decomposer
from .decompose.inputs import read_captions
from .decompose.run import run_decompose
from .eval.evaluate import EvalConfig, evaluate, label, world_cache_features
from .eval.figures import retrieval_figure
from .features import ExtractConfig
from .methods import DEFAULT_METHODS, MethodOptions
from .model import FoCoConfig
from .train.data import build_pair_table
from .train.foco import FoCoTrainConfig, train_foco
from .train.world_backbone import BackboneTrainConfig, train_world_backbone
from .utils.io import atomic_write_text
from .world.decompositions import world_decompositions
from .world.generate import generate_world, world_config
from .world.splits import extract_world_split

log = logging.getLogger(__name__)


@dataclass
class QuickstartPlan:
    size: str
    backbone: BackboneTrainConfig
    foco: FoCoTrainConfig
    benchmark_split: str = "test"
    figures: int = 6


def quickstart_plan(size: str) -> QuickstartPlan:
    """World-sized settings. The paper's recipe (lr 5e-4, then 5e-5/3e-5, batch 512, 3 + 30 epochs) is for CC3M
    with ViT-L/14; the world has 10k pairs and 2 CPU cores, so fewer, larger steps and at most 31 negatives per
    anchor. The learnable sigmoid bias is on: without it FoCo collapses on the world (docs/benchmarks.md)."""
    if size == "tiny":
        return QuickstartPlan(
            size, BackboneTrainConfig(epochs=8, batch_size=64),
            FoCoTrainConfig(stage1_epochs=2, stage2_epochs=4, batch_size=64, lr_stage1=1e-3, lr_aggr=5e-4,
                            lr_comp=5e-4, model=FoCoConfig(learn_bias=True)))
    return QuickstartPlan(
        size, BackboneTrainConfig(epochs=6, batch_size=256),
        FoCoTrainConfig(stage1_epochs=2, stage2_epochs=3, batch_size=128, lr_stage1=1e-3, lr_aggr=3e-4,
                        lr_comp=3e-4, max_negatives=31, model=FoCoConfig(learn_bias=True)))


def _stage(name: str):
    log.info("== %s", name)
    return time.time()


def run_quickstart(out: str | Path, size: str = "default", seed: int = 0, decomposer: str = "oracle") -> dict:
    """`decomposer` other than oracle (the paper's rule-based ablation) trains and evaluates into its own
    folders (features/train-<name>, foco-<name>, results-<name>.json) beside the oracle run, reusing the rest."""
    out = Path(out)
    suffix = "" if decomposer == "oracle" else f"-{decomposer}"
    plan = quickstart_plan(size)
    timings = {}
    t = _stage("world")
    world = out / "world"
    generate_world(world, world_config(size, seed=seed))
    timings["world_s"] = time.time() - t

    t = _stage("backbone")
    bb_dir = out / "backbone"
    if not (bb_dir / "metrics.json").is_file():
        train_world_backbone(world, bb_dir, plan.backbone)
    backbone = load_world_backbone(bb_dir)
    timings["backbone_s"] = time.time() - t

    t = _stage(f"decompositions ({decomposer})")
    store = out / "decompositions.sqlite"
    records = read_captions(world, split="train")
    run_decompose([r.caption for r in records], build_decomposer(decomposer, records), store, batch_size=256)
    decompositions = world_decompositions(world, "train", store, decomposer)
    timings["decompose_s"] = time.time() - t

    t = _stage("features")
    feats = out / "features"
    xcfg = ExtractConfig()
    extract_world_split(backbone, world, "train", feats / f"train{suffix}", xcfg, include_captions=False,
                        decompositions=decompositions)
    for protocol in ("single", "multi"):
        extract_world_split(backbone, world, f"{plan.benchmark_split}/{protocol}", feats / f"{plan.benchmark_split}-{protocol}", xcfg)
    timings["features_s"] = time.time() - t

    t = _stage(f"FoCo training ({decomposer} decompositions)")
    foco_dir = out / f"foco{suffix}"
    if not (foco_dir / "foco.safetensors").is_file():
        table = build_pair_table(feats / f"train{suffix}", decompositions)
        train_foco(table, foco_dir, plan.foco, resume=True, meta={"backbone": backbone.spec})
    timings["foco_train_s"] = time.time() - t

    t = _stage("evaluation")
    results = evaluate_world(world, plan.benchmark_split, feats, foco_dir, out / f"attention{suffix}", plan.figures)
    results = {"benchmark": f"world-{size}/{plan.benchmark_split}", "decomposer": decomposer, **results}
    timings["eval_s"] = time.time() - t
    results["timings_s"] = {k: round(v, 1) for k, v in timings.items()}
    atomic_write_text(out / f"results{suffix}.json", json.dumps(results, indent=2) + "\n")
    return results


def evaluate_world(world: Path, split: str, features: Path, checkpoint: Path, figures: Path, n_figures: int) -> dict:
    """FoCo and the simple baselines on the world's `split` through the one evaluation path, with attention figures
    of FoCo on `single`: {"protocols", "methods" (one row per method), "R@1_by_edit_type"}."""
    cfg = EvalConfig(methods=DEFAULT_METHODS, options=MethodOptions(checkpoint=checkpoint), by_category=True)

    def figure_hook(name: str, bench: CIRBenchmark, feats: PartFeatures, composed, rankings) -> None:
        if name == "foco" and bench.name == "world/single":
            _figures(bench, composed, rankings, figures, n_figures)

    res = evaluate(read_world(world, split), world_cache_features(features), cfg, on_ranked=figure_hook)
    return {"protocols": {label(p): {"queries": e["queries"], "gallery": e["gallery"]}
                          for p, e in res["parts"].items()},
            "methods": res["methods"],
            "R@1_by_edit_type": {name: {t: round(v, 2) for t, v in by_type.items()}
                                 for name, by_type in res["parts"]["world/single"]["R@1_by_category"].items()}}


def _figures(bench: CIRBenchmark, composed, rankings, folder: Path, n: int) -> None:
    """The first query of each of `n` edit types, with FoCo's attention and its top 5."""
    chosen, seen = [], set()
    for q, query in enumerate(bench.queries):
        if query.category not in seen:
            chosen.append(q)
            seen.add(query.category)
        if len(chosen) == n:
            break
    for q in chosen:
        query = bench.queries[q]
        top = [rankings.gallery_ids[i] for i in rankings.full[q, :5].tolist()]
        retrieval_figure(folder / f"{query.id}-{query.category}.png", bench.images[query.reference].load(),
                         composed.attention[q] if composed.attention is not None else None, query.texts[0],
                         [bench.images[g].load() for g in top], [g in query.targets for g in top])
