"""Choosing a method's free parameter on a val benchmark part: any method option with a `val_grid` (slerp's alpha),
Chord's lambda, the box's beta.

Each choice runs the one evaluation path (compose -> rank -> score) over a grid and keeps the best value of the
protocol's headline metric (`headline_metric`); ties go to the smaller value (the smaller |beta|).
"""
from __future__ import annotations

from typing import Sequence

import torch

from ..benchmarks.base import CIRBenchmark, EvalProtocol
from ..benchmarks.cache import PartFeatures
from ..methods import MethodOptions, build_method
from ..methods.base import MethodOption
from ..methods.slerp import ALPHA, ALPHA_GRID
from .compose import compose, reference_rows
from .rank import Chord, rank, score

LAMBDA_GRID = ALPHA_GRID


def headline_metric(protocol: EvalProtocol) -> str:
    """The metric a choice optimises: the protocol's average where it has one (OACIR), mAP@10 (or the first mAP@K)
    where it has mAP, else the smallest R@K (R@1 for CIRR and the world's `single`, R@10 for FashionIQ)."""
    if protocol.average:  # OACIR: the average of R_ID@1, R@1 and R@5, as its tables rank methods
        return "Avg"
    if protocol.map_ks:
        return "mAP@10" if 10 in protocol.map_ks else f"mAP@{protocol.map_ks[0]}"
    return f"R@{min(protocol.recall_ks)}"


def choose_on_val(method: str, option: MethodOption, opts: MethodOptions, bench: CIRBenchmark,
                  feats: PartFeatures, grid: Sequence[float] | None = None, metric: str | None = None
                  ) -> tuple[float, dict[float, float]]:
    """`method`'s `option` on a val part: `method` built from `opts` with each value of the grid (the option's
    `val_grid` unless given), scored by `metric` (the headline). Returns (value, {value: metric})."""
    metric = metric or headline_metric(bench.protocol)
    grid = option.val_grid if grid is None else grid
    if not grid:
        raise ValueError(f"{method}'s option {option.flag} has no grid to choose a value on val from")
    table = {}
    for a in grid:
        m = build_method(method, opts=opts.replace(**{option.name: float(a)}))
        table[float(a)] = score(bench, rank(bench, feats.gallery_ids, feats.gallery,
                                            compose(m, bench, feats).query))[metric]
    best = max(table, key=lambda a: (table[a], -a))
    return best, table


def choose_alpha(bench: CIRBenchmark, feats: PartFeatures, grid: Sequence[float] = ALPHA_GRID,
                 metric: str | None = None) -> tuple[float, dict[float, float]]:
    """slerp's alpha on a val part. Returns (alpha, {alpha: metric})."""
    return choose_on_val("slerp", ALPHA, MethodOptions(), bench, feats, grid, metric)


def choose_lambda(queries: torch.Tensor, bench: CIRBenchmark, feats: PartFeatures,
                  grid: Sequence[float] = LAMBDA_GRID, metric: str | None = None, shortlist: int | None = None
                  ) -> tuple[float, dict[float, float]]:
    """Chord's lambda for one method's val queries (Q, D). Returns (lambda, {lambda: metric})."""
    metric = metric or headline_metric(bench.protocol)
    refs = feats.references.global_[reference_rows(bench, feats)].float()  # (Q, D)
    table = {float(lam): score(bench, rank(bench, feats.gallery_ids, feats.gallery, queries,
                                           Chord(float(lam), refs, shortlist)))[metric] for lam in grid}
    best = max(table, key=lambda lam: (table[lam], -lam))
    return best, table


def choose_beta(results: dict[float, dict[str, float]], metric: str = "R@1") -> float:
    """The beta of `foco.eval.box.evaluate_box_anchoring`'s val results with the best `metric`; ties go to the
    smallest |beta|."""
    return max(results, key=lambda b: (results[b][metric], -abs(b)))
