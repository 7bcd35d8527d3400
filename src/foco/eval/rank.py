"""Ranking composed queries on a `CIRBenchmark` and scoring the rankings: one code path for every benchmark, the
embedded world's included, with Chord rescoring as an option of the same path.

Pure functions of tensors: the caller brings the gallery vectors and the composed queries. Ranking uses
`foco.index.ExactIndex` (ties broken by gallery order) and metrics come from `foco.metrics`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .chord import chord_scores_candidates, chord_search
from ..index import ExactIndex
from ..metrics import instance_recall_at_k, map_at_k, recall_at_k, subset_recall_at_k
from ..benchmarks.base import CIRBenchmark

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
    return max([*p.recall_ks, *p.map_ks, *p.instance_ks, SUBMISSION_DEPTH if p.submission else 1])


@dataclass
class Chord:
    """Chord rescoring (`foco.chord`): lambda, each query's reference feature (Q, D) in the gallery's space, and an
    optional cosine shortlist for the full-gallery ranking (None: every gallery item is rescored)."""

    lam: float
    references: torch.Tensor
    shortlist: int | None = None


def rank(bench: CIRBenchmark, gallery_ids: list[str], gallery: torch.Tensor, queries: torch.Tensor,
         chord: Chord | None = None) -> Rankings:
    """gallery: (N, D) normalised vectors of `gallery_ids`; queries: (Q, D), one per benchmark query. With
    `chord`, every ranking (full, subset, own gallery) orders by the Chord score instead of the cosine."""
    if queries.shape[0] != len(bench.queries):
        raise ValueError(f"{queries.shape[0]} query vectors for {len(bench.queries)} queries")
    device = queries.device  # ranking runs where the method composed its queries (`--device`)
    gallery = gallery.to(device)  # (N, D)
    if chord is not None:
        chord = Chord(chord.lam, chord.references.to(device), chord.shortlist)
    pos = {g: i for i, g in enumerate(gallery_ids)}

    def order(q: int, rows: list[int]) -> list[int]:
        if chord is None or chord.lam == 0:
            return _order(gallery[rows] @ queries[q].float())
        return _order(chord_scores_candidates(queries[q:q + 1], gallery[rows][None], chord.references[q:q + 1],
                                              chord.lam)[0])

    if not bench.gallery:  # every query ranks its own gallery
        own = [order(q, [pos[g] for g in query.gallery or []]) for q, query in enumerate(bench.queries)]
        return Rankings(gallery_ids, None, None, own)
    exclude = None
    if bench.protocol.remove_reference:
        exclude = torch.tensor([pos[q.reference] for q in bench.queries], device=device)  # (Q,)
    if chord is None or chord.lam == 0:
        index = ExactIndex(gallery.shape[1], device=device)
        index.add(gallery)
        _, full = index.search(queries, ranking_depth(bench), exclude=exclude)  # (Q, K)
    else:
        _, full = chord_search(queries, gallery, chord.references, chord.lam, ranking_depth(bench),
                               chord.shortlist, exclude=exclude)  # (Q, K)
    subset = None
    if bench.protocol.subset_ks or bench.protocol.submission == "cirr":
        subset = []
        for q, query in enumerate(bench.queries):
            cand = [pos[m] for m in query.subset if m != query.reference]
            subset.append([cand[i] for i in order(q, cand)])  # only the subset
    return Rankings(gallery_ids, full.cpu(), subset, None)


def _order(scores: torch.Tensor) -> list[int]:
    """(n,) scores -> positions best first; ties keep the given order."""
    return torch.sort(scores, descending=True, stable=True).indices.tolist()


def score_by_category(bench: CIRBenchmark, r: Rankings, k: int = 1) -> dict[str, float]:
    """R@k over the shared gallery for each query category (world edit types, FashionIQ categories), categories in
    sorted order; empty without ground truth, categories or a shared-gallery ranking."""
    if not bench.has_targets or r.full is None or not any(q.category for q in bench.queries):
        return {}
    pos = {g: i for i, g in enumerate(r.gallery_ids)}
    out = {}
    for c in sorted({q.category or "" for q in bench.queries}):
        rows = [i for i, q in enumerate(bench.queries) if (q.category or "") == c]
        out[c] = recall_at_k(r.full[rows], [[pos[t] for t in bench.queries[i].targets] for i in rows], k)
    return out


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
    out = {}
    if p.instance_ks:  # OACIR: the anchored instance's identity, whatever its context
        missing = [q.id for q in bench.queries if q.instance is None]
        if missing:
            raise ValueError(f"{bench.name}: {len(missing)} queries without an instance for R_ID@K, e.g. {missing[0]}")
        unknown = [g for g in r.gallery_ids if g not in bench.instances]
        if unknown:  # a reader that left them out would score R_ID@K as 0 without a word
            raise ValueError(f"{bench.name}: {len(unknown)} gallery images without their instances for R_ID@K, "
                             f"e.g. {unknown[0]}")
        shown = [bench.instances[g] for g in r.gallery_ids]
        out.update({f"R_ID@{k}": instance_recall_at_k(r.full, [q.instance for q in bench.queries], shown, k)
                    for k in p.instance_ks})
    out.update({f"R@{k}": recall_at_k(r.full, targets, k) for k in p.recall_ks})
    out.update({f"Rs@{k}": subset_recall_at_k(r.subset, targets, k) for k in p.subset_ks})
    out.update({f"mAP@{k}": map_at_k(r.full, targets, k) for k in p.map_ks})
    if p.average:
        out["Avg"] = sum(out[m] for m in p.average) / len(p.average)
    return out


def score_queries(queries: torch.Tensor, bench: CIRBenchmark, gallery_ids: list[str], gallery: torch.Tensor,
                  chord: Chord | None = None) -> dict[str, float]:
    """`score(bench, rank(...))`: every metric of the protocol for queries (Q, D) against gallery (N, D)."""
    return score(bench, rank(bench, gallery_ids, gallery, queries, chord))
