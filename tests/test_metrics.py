"""Retrieval metrics against naive twins."""
import random

import torch

from foco.metrics import diagonal_recalls, rank_by_score, recall_at_k


def naive_recall(scores, targets, k):
    hits = 0
    for q, row in enumerate(scores.tolist()):
        order = sorted(range(len(row)), key=lambda j: (-row[j], j))
        hits += any(j in targets[q] for j in order[:k])
    return 100.0 * hits / len(targets)


def test_recall_matches_naive_on_random_scores():
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        Q, N = 13, 40
        scores = torch.randint(0, 6, (Q, N), generator=g).float()  # many ties
        targets = [random.Random(trial * 100 + q).sample(range(N), 1 + q % 3) for q in range(Q)]
        ranking = rank_by_score(scores)
        for k in (1, 2, 5, 10, 40):
            assert recall_at_k(ranking, targets, k) == naive_recall(scores, targets, k)


def test_diagonal_recalls_hand_computed():
    scores = torch.tensor([[0.9, 0.1, 0.0], [0.8, 0.7, 0.0], [0.3, 0.2, 0.1]])
    r = diagonal_recalls(scores, (1, 2, 3))
    assert r == {"R@1": 100 / 3, "R@2": 200 / 3, "R@3": 100.0}
