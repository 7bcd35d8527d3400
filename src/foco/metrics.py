"""Retrieval metrics as pure functions on rankings.

A ranking is a (Q, N) integer tensor: row q lists gallery indices from best to worst for query q. Ground truth is
a list, per query, of target gallery indices. Results are percentages (0-100), as papers report them.
"""
from __future__ import annotations

from typing import Sequence

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
