"""Evaluation of composed-query methods on the world benchmarks, from cached features.

Benchmarks differ only in data and ground truth; ranking and metrics are shared:
* `single` (CIRR-like): R@1/5/10/50 over the whole gallery with the reference removed from each ranking, and
  subset R@1/2/3 over each query's subset members minus the reference.
* `multi` (CIRCO-like): mAP@5/10/25/50, the reference not removed.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .backbones.base import ImageFeatures, TextFeatures
from .baselines import QueryMethod
from .features import FeatureCache
from .index import ExactIndex
from .metrics import map_at_k, recall_at_k, subset_recall_at_k
from .world.manifest import WorldBenchmark, load_benchmark

RECALL_KS = (1, 5, 10, 50)
SUBSET_KS = (1, 2, 3)
MAP_KS = (5, 10, 25, 50)


@dataclass
class BenchmarkFeatures:
    """A benchmark with its cached gallery and query-text features, aligned by index."""

    bench: WorldBenchmark
    gallery: ImageFeatures  # (N, D), (N, P, D)
    ref_index: torch.Tensor  # (Q,) gallery index of each reference
    texts: TextFeatures  # (Q, D), (Q, L, D), (Q, L): the modification of each query
    target_index: list[list[int]]
    subset_index: list[list[int]]


def load_benchmark_features(world: str | Path, split: str, protocol: str, cache: str | Path) -> BenchmarkFeatures:
    bench = load_benchmark(world, split, protocol)
    fc = FeatureCache(cache)
    ids, gallery = fc.images()
    if ids != bench.gallery_ids:
        raise ValueError(f"feature cache {cache} does not hold the gallery of {split}/{protocol}; extract it with "
                         f"`foco features extract --split {split}/{protocol}`")
    text_ids, texts = fc.texts()
    tpos = {t: i for i, t in enumerate(text_ids)}
    missing = [m for m in bench.modifications if m not in tpos]
    if missing:
        raise ValueError(f"{len(missing)} modification texts are missing from {cache}")
    rows = torch.tensor([tpos[m] for m in bench.modifications])
    gi = {g: i for i, g in enumerate(bench.gallery_ids)}
    return BenchmarkFeatures(
        bench=bench, gallery=gallery, ref_index=torch.tensor([gi[r] for r in bench.references]),
        texts=TextFeatures(texts.global_[rows], texts.tokens[rows], texts.mask[rows]),
        target_index=[[gi[t] for t in ts] for ts in bench.targets],
        subset_index=[[gi[s] for s in ss] for ss in bench.subsets])


def compose_queries(method: QueryMethod, bf: BenchmarkFeatures, batch_size: int = 256,
                    anchors: torch.Tensor | None = None) -> torch.Tensor:
    """(Q, D) normalised composed queries, one per benchmark query. `anchors` (Q, D), for FoCo only: a separate
    anchor text per query (T_m decomposed at inference)."""
    out = []
    for s in range(0, len(bf.ref_index), batch_size):
        r = bf.ref_index[s:s + batch_size]
        ref = ImageFeatures(bf.gallery.global_[r], bf.gallery.patches[r])
        mod = TextFeatures(bf.texts.global_[s:s + batch_size], bf.texts.tokens[s:s + batch_size],
                           bf.texts.mask[s:s + batch_size])
        with torch.inference_mode():
            if anchors is None:
                out.append(method.encode(ref, mod).query.float())
            else:
                out.append(method.encode(ref, mod, anchor=anchors[s:s + batch_size]).query.float())
    return torch.cat(out)


def score_queries(queries: torch.Tensor, bf: BenchmarkFeatures) -> dict[str, float]:
    """All metrics of the benchmark's protocol for precomputed queries."""
    index = ExactIndex(queries.shape[1])
    index.add(bf.gallery.global_)
    if bf.bench.protocol == "single":
        _, ranking = index.search(queries, max(RECALL_KS), exclude=bf.ref_index)  # reference removed
        out = {f"R@{k}": recall_at_k(ranking, bf.target_index, k) for k in RECALL_KS}
        subset_rankings = []
        for q, members in enumerate(bf.subset_index):
            cand = [m for m in members if m != int(bf.ref_index[q])]
            scores = bf.gallery.global_[cand] @ queries[q].float()  # (5,): only the subset, not the whole gallery
            order = torch.sort(scores, descending=True, stable=True).indices.tolist()
            subset_rankings.append([cand[i] for i in order])
        out.update({f"Rs@{k}": subset_recall_at_k(subset_rankings, bf.target_index, k) for k in SUBSET_KS})
        return out
    _, ranking = index.search(queries, max(MAP_KS))
    return {f"mAP@{k}": map_at_k(ranking, bf.target_index, k) for k in MAP_KS}


def evaluate_method(method: QueryMethod, bf: BenchmarkFeatures) -> dict[str, float]:
    return score_queries(compose_queries(method, bf), bf)


def recall_by_edit_type(queries: torch.Tensor, bf: BenchmarkFeatures, k: int = 1) -> dict[str, float]:
    """R@k (reference removed) for each edit type of a `single` benchmark."""
    index = ExactIndex(queries.shape[1])
    index.add(bf.gallery.global_)
    _, ranking = index.search(queries, k, exclude=bf.ref_index)
    out = {}
    for t in sorted(set(bf.bench.edit_types)):
        rows = [q for q, e in enumerate(bf.bench.edit_types) if e == t]
        out[t] = recall_at_k(ranking[rows], [bf.target_index[q] for q in rows], k)
    return out
