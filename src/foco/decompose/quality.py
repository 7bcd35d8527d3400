"""How well a decomposer finds the local phrases: precision and recall against a reference decomposition.

Pure functions. A local phrase is compared after normalisation (lower case, punctuation removed, a leading
article dropped), so "The beach" matches "a beach". Matching is one-to-one within a caption (multisets).
"""
from __future__ import annotations

import re
from collections import Counter

from .schema import Decomposition

_ARTICLE = re.compile(r"^(a|an|the)\s+")


def normalise_phrase(phrase: str) -> str:
    p = re.sub(r"[^\w\s-]", " ", phrase.lower())
    p = re.sub(r"\s+", " ", p).strip()
    return _ARTICLE.sub("", p)


def local_matches(predicted: Decomposition, reference: Decomposition) -> tuple[int, int, int]:
    """(matched, number predicted, number in the reference) for one caption."""
    pred = Counter(normalise_phrase(p.local) for p in predicted.pairs)
    ref = Counter(normalise_phrase(p.local) for p in reference.pairs)
    return sum((pred & ref).values()), sum(pred.values()), sum(ref.values())


def local_precision_recall(predicted: list[Decomposition], reference: list[Decomposition]) -> dict[str, float]:
    """Micro-averaged precision, recall and F1 (in %) of local phrases over aligned lists of captions."""
    if len(predicted) != len(reference):
        raise ValueError(f"{len(predicted)} predictions for {len(reference)} references")
    m = p = r = 0
    for a, b in zip(predicted, reference):
        dm, dp, dr = local_matches(a, b)
        m, p, r = m + dm, p + dp, r + dr
    precision = 100.0 * m / p if p else 0.0
    recall = 100.0 * m / r if r else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "matched": m, "predicted": p, "reference": r}
