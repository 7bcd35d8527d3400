"""Ranking composed queries on a `CIRBenchmark` and scoring the rankings: one code path for every benchmark.

Pure functions of tensors: the caller brings the gallery vectors and the composed queries. Ranking uses
`foco.index.ExactIndex` (ties broken by gallery order) and metrics come from `foco.metrics`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..index import ExactIndex
from ..metrics import map_at_k, recall_at_k, subset_recall_at_k
from .base import CIRBenchmark

SUBMISSION_DEPTH = 50  # CIRR's and CIRCO's servers take the top 50 of each query


@dataclass
class Rankings:
    """What a method's queries retrieve; gallery indices refer to `gallery_ids`."""

    gallery_ids: list[str]
    full: torch.Tensor | None  # (Q, K) shared-gallery indices, best first (reference removed if the protocol says)
    subset: list[list[int]] | None  # per query: subset members minus the reference, best first (CIRR)
    own: list[list[int]] | None  # per query: positions in the query's own gallery, best first (GeneCIS)


def ranking_depth(bench: CIRBenchmark) -> int:
    """How much of the shared-gallery ranking the metrics (and a submission) need."""
    p = bench.protocol
    return max([*p.recall_ks, *p.map_ks, SUBMISSION_DEPTH if p.submission else 1])


def rank(bench: CIRBenchmark, gallery_ids: list[str], gallery: torch.Tensor, queries: torch.Tensor) -> Rankings:
    """gallery: (N, D) normalised vectors of `gallery_ids`; queries: (Q, D), one per benchmark query."""
    if queries.shape[0] != len(bench.queries):
        raise ValueError(f"{queries.shape[0]} query vectors for {len(bench.queries)} queries")
    pos = {g: i for i, g in enumerate(gallery_ids)}
    if not bench.gallery:  # every query ranks its own gallery
        own = []
        for q, query in enumerate(bench.queries):
            rows = [pos[g] for g in query.gallery or []]
            own.append(_order(gallery[rows] @ queries[q].float()))
        return Rankings(gallery_ids, None, None, own)
    index = ExactIndex(gallery.shape[1])
    index.add(gallery)
    exclude = None
    if bench.protocol.remove_reference:
        exclude = torch.tensor([pos[q.reference] for q in bench.queries])  # (Q,)
    _, full = index.search(queries, ranking_depth(bench), exclude=exclude)  # (Q, K)
    subset = None
    if bench.protocol.subset_ks or bench.protocol.submission == "cirr":
        subset = []
        for q, query in enumerate(bench.queries):
            cand = [pos[m] for m in query.subset if m != query.reference]
            subset.append([cand[i] for i in _order(gallery[cand] @ queries[q].float())])  # only the subset
    return Rankings(gallery_ids, full, subset, None)


def _order(scores: torch.Tensor) -> list[int]:
    """(n,) scores -> positions best first; ties keep the given order."""
    return torch.sort(scores, descending=True, stable=True).indices.tolist()


def score(bench: CIRBenchmark, r: Rankings) -> dict[str, float]:
    """Every metric of the benchmark's protocol; empty when it has no ground truth (test splits)."""
    if not bench.has_targets:
        return {}
    p = bench.protocol
    if r.own is not None:
        targets = [[i for i, g in enumerate(q.gallery or []) if g in q.targets] for q in bench.queries]
        return {f"R@{k}": subset_recall_at_k(r.own, targets, k) for k in p.recall_ks}
    pos = {g: i for i, g in enumerate(r.gallery_ids)}
    targets = [[pos[t] for t in q.targets] for q in bench.queries]
    out = {f"R@{k}": recall_at_k(r.full, targets, k) for k in p.recall_ks}
    out.update({f"Rs@{k}": subset_recall_at_k(r.subset, targets, k) for k in p.subset_ks})
    out.update({f"mAP@{k}": map_at_k(r.full, targets, k) for k in p.map_ks})
    return out
