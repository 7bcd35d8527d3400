"""`foco quickstart`: world -> backbone -> decompositions (oracle) -> FoCo training -> evaluation, end to end.

Every stage reuses what an earlier run left in the output folder, so a second run only re-evaluates.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .backbones.train_world import BackboneTrainConfig, train_world_backbone
from .backbones.world import load_world_backbone
from .baselines import METHODS, build_method
from .data import build_pair_table
from .decompose import build_decomposer
from .decompose.inputs import read_captions
from .decompose.run import run_decompose
from .decompose.world import world_decompositions
from .evaluate import compose_queries, load_benchmark_features, recall_by_edit_type, score_queries
from .features import ExtractConfig
from .index import ExactIndex
from .model import FoCoConfig
from .train import FoCoTrainConfig, train_foco
from .utils.io import atomic_write_text, load_image
from .viz import retrieval_figure
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
    results = {"benchmark": f"world-{size}/{plan.benchmark_split}", "decomposer": decomposer, "protocols": {},
               "methods": {}}
    for protocol in ("single", "multi"):
        bf = load_benchmark_features(world, plan.benchmark_split, protocol, feats / f"{plan.benchmark_split}-{protocol}")
        results["protocols"][protocol] = {"queries": len(bf.ref_index), "gallery": len(bf.bench.gallery_ids)}
        for name in METHODS:
            method = build_method(name, foco_dir if name == "foco" else None)
            queries = compose_queries(method, bf)
            results["methods"].setdefault(name, {}).update(score_queries(queries, bf))
            if protocol == "single":
                results.setdefault("R@1_by_edit_type", {})[name] = {
                    t: round(v, 2) for t, v in recall_by_edit_type(queries, bf).items()}
            if name == "foco" and protocol == "single":
                _figures(method, bf, queries, out / f"attention{suffix}", plan.figures)
    timings["eval_s"] = time.time() - t
    results["timings_s"] = {k: round(v, 1) for k, v in timings.items()}
    atomic_write_text(out / f"results{suffix}.json", json.dumps(results, indent=2) + "\n")
    return results


def _figures(method, bf, queries: torch.Tensor, folder: Path, n: int) -> None:
    """A few queries of different edit types, with attention and top-5."""
    from .backbones.base import ImageFeatures, TextFeatures
    chosen, seen = [], set()
    for q, t in enumerate(bf.bench.edit_types):
        if t not in seen:
            chosen.append(q)
            seen.add(t)
        if len(chosen) == n:
            break
    index = ExactIndex(queries.shape[1])
    index.add(bf.gallery.global_)
    rows = torch.tensor(chosen)
    _, top_chosen = index.search(queries[rows], 5, exclude=bf.ref_index[rows])
    top = dict(zip(chosen, top_chosen))
    for q in chosen:
        r = bf.ref_index[q:q + 1]
        with torch.inference_mode():
            cq = method.encode(ImageFeatures(bf.gallery.global_[r], bf.gallery.patches[r]),
                               TextFeatures(bf.texts.global_[q:q + 1], bf.texts.tokens[q:q + 1], bf.texts.mask[q:q + 1]))
        images = bf.bench.gallery_images
        retrieval_figure(folder / f"{bf.bench.query_ids[q]}-{bf.bench.edit_types[q]}.png",
                         load_image(images[int(r)]), cq.attention[0] if cq.attention is not None else None,
                         bf.bench.modifications[q], [load_image(images[i]) for i in top[q].tolist()],
                         [i in bf.target_index[q] for i in top[q].tolist()])


def results_table(results: dict) -> str:
    cols = ["R@1", "R@5", "R@10", "R@50", "Rs@1", "Rs@2", "Rs@3", "mAP@5", "mAP@10", "mAP@25", "mAP@50"]
    lines = [f"Benchmark: {results['benchmark']} "
             + ", ".join(f"{p}: {v['queries']} queries / {v['gallery']} gallery" for p, v in results["protocols"].items()),
             "", "| method | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for name, m in results["methods"].items():
        lines.append(f"| {name} | " + " | ".join(f"{m[c]:.1f}" if c in m else "-" for c in cols) + " |")
    by_type = results.get("R@1_by_edit_type")
    if by_type:
        types = sorted(next(iter(by_type.values())))
        lines += ["", "R@1 by edit type (single):", "", "| method | " + " | ".join(types) + " |",
                  "|---|" + "---|" * len(types)]
        for name, m in by_type.items():
            lines.append(f"| {name} | " + " | ".join(f"{m[t]:.1f}" for t in types) + " |")
    return "\n".join(lines)
