"""Retrieval metrics as pure functions on rankings.

A ranking is a (Q, N) integer tensor: row q lists gallery indices from best to worst for query q. Ground truth is
a list, per query, of target gallery indices. Results are percentages (0-100), as papers report them.
"""
from __future__ import annotations

from typing import Collection, Sequence

import torch


def rank_by_score(scores: torch.Tensor, k: int | None = None) -> torch.Tensor:
    """(Q, N) scores -> (Q, k) gallery indices, best first; ties keep gallery order (stable)."""
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices  # (Q, N)
    return order if k is None else order[:, :k]


def recall_at_k(ranking: torch.Tensor, targets: Sequence[Sequence[int]], k: int) -> float:
    """100 * mean over queries of [any target within the first k of the ranking]."""
    if ranking.shape[0] != len(targets):
        raise ValueError(f"{ranking.shape[0]} rankings for {len(targets)} queries")
    if len(targets) == 0:
        raise ValueError("no queries")
    top = ranking[:, :k]
    hits = [bool(set(top[q].tolist()) & set(map(int, t))) for q, t in enumerate(targets)]
    return 100.0 * sum(hits) / len(hits)


def diagonal_recalls(scores: torch.Tensor, ks: Sequence[int] = (1, 5, 10)) -> dict[str, float]:
    """Recall@k when query q's only target is gallery item q (paired retrieval, e.g. caption -> image)."""
    ranking = rank_by_score(scores, max(ks))
    targets = [[q] for q in range(scores.shape[0])]
    return {f"R@{k}": recall_at_k(ranking, targets, k) for k in ks}


def instance_recall_at_k(ranking: torch.Tensor, query_instances: Sequence[str],
                         gallery_instances: Sequence[Collection[str]], k: int) -> float:
    """OACIR's R_ID@K: 100 * mean over queries of [an image within the first k shows the query's instance].

    Args:
        ranking: (Q, >=k) gallery indices, best first (the reference already removed, as for R@K).
        query_instances: (Q,) the identity of each query's anchored instance.
        gallery_instances: (N,) per gallery item, the identities of the instances it shows.
    It is `recall_at_k` with "shows the instance" as the relevant set: OACIRR's official evaluation counts a hit
    when a top-k image is in the target's instance folder, one instance per image; here an image may show several.
    """
    if ranking.shape[0] != len(query_instances):
        raise ValueError(f"{ranking.shape[0]} rankings for {len(query_instances)} queries")
    showing: dict[str, list[int]] = {}  # instance -> gallery indices that show it
    for i, shown in enumerate(gallery_instances):
        for inst in set(shown):
            showing.setdefault(str(inst), []).append(i)
    return recall_at_k(ranking, [showing.get(str(inst), []) for inst in query_instances], k)


def subset_recall_at_k(subset_rankings: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], k: int) -> float:
    """CIRR's Recall_subset@K: each query ranks only its own subset members (reference already removed)."""
    if len(subset_rankings) != len(targets) or not targets:
        raise ValueError("need one subset ranking per query, and at least one query")
    hits = [bool(set(map(int, r[:k])) & set(map(int, t))) for r, t in zip(subset_rankings, targets)]
    return 100.0 * sum(hits) / len(hits)


def average_precision_at_k(ranked: Sequence[int], targets: Sequence[int], k: int) -> float:
    """AP@K as the CIRCO evaluator computes it:
    labels = [r in gt for r in ranked[:K]]; prec_n = (#hits in the first n) * labels_n / n;
    AP@K = sum(prec[:K]) / min(len(gt), K). Predictions are expected to be unique ids."""
    gt = set(map(int, targets))
    hits, total = 0, 0.0
    for n, r in enumerate(ranked[:k], 1):
        if int(r) in gt:
            hits += 1
            total += hits / n
    return total / min(len(gt), k)


def map_at_k(ranking: torch.Tensor, targets: Sequence[Sequence[int]], k: int) -> float:
    """100 * mean over queries of AP@K (CIRCO's mAP@K). A ranking shorter than K (a gallery smaller than K) is
    scored on the items it has; the normaliser stays min(|gt|, K)."""
    if ranking.shape[0] != len(targets) or not targets:
        raise ValueError("need one ranking per query, and at least one query")
    return 100.0 * sum(average_precision_at_k(ranking[q, :k].tolist(), t, k)
                       for q, t in enumerate(targets)) / len(targets)
