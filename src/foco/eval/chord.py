"""Chord scoring (PACT, Kwon 2026): rescoring retrieval candidates with the reference-relative direction.

For a composed query q, a reference image r and a candidate image c (all L2-normalised, in the frozen image space)

    chord(q, c | r) = cos(q, c) + lambda * cos(c - r, q - r),

i.e. target similarity plus agreement between the change the candidate makes to the reference and the change the
query asks for. The direction term is 0 when c or q coincides with r (|c - r| or |q - r| below `eps`). lambda is
chosen on a val benchmark (`foco.eval.select.choose_lambda`). It works for every method: it needs only the queries, the gallery and
each query's reference, and it is an option of the one ranking path (`foco.eval.rank.rank(..., chord=Chord(...))`).

Two search modes, one interface (`chord_search` -> (scores, ids), each (Q, k), best first):
* exact: every gallery item is rescored (two matrix products; fine for galleries of a few 10k images);
* shortlist: the top `shortlist` items by cosine (`foco.index.ExactIndex`) are rescored, so it composes with any
  top-k index; items outside the cosine shortlist cannot enter the top k.

The cosine term is computed in float32 exactly as `ExactIndex` does, so lambda = 0 ranks as plain cosine; the
direction term is computed in float64 from dot products (|c - r|^2 = |c|^2 - 2 c.r + |r|^2 cancels badly in float32).
"""
from __future__ import annotations

import torch

from ..index import ExactIndex
from ..metrics import rank_by_score

EPS = 1e-6


def _direction(qc: torch.Tensor, rc: torch.Tensor, cc: torch.Tensor, qr: torch.Tensor, qq: torch.Tensor,
               rr: torch.Tensor, eps: float) -> torch.Tensor:
    """cos(c - r, q - r) from float64 dot products; every argument broadcasts to (Q, n)."""
    num = qc - rc - qr + rr  # (c - r).(q - r)
    dc = (cc - 2 * rc + rr).clamp_min(0).sqrt()  # |c - r|
    dq = (qq - 2 * qr + rr).clamp_min(0).sqrt()  # |q - r|
    ok = (dc > eps) & (dq > eps)
    return torch.where(ok, num / torch.where(ok, dc * dq, torch.ones_like(dc)), torch.zeros_like(num))


def chord_scores(queries: torch.Tensor, gallery: torch.Tensor, references: torch.Tensor, lam: float,
                 eps: float = EPS) -> torch.Tensor:
    """Chord scores of every gallery item: queries (Q, D), gallery (N, D), references (Q, D), all L2-normalised
    -> (Q, N)."""
    q, c, r = queries.float(), gallery.float(), references.float()
    cos = q @ c.t()  # (Q, N), as ExactIndex.scores
    if lam == 0:
        return cos
    q64, c64, r64 = q.double(), c.double(), r.double()
    qc, rc = q64 @ c64.t(), r64 @ c64.t()  # (Q, N)
    cc = (c64 * c64).sum(-1)[None]  # (1, N)
    qr, qq, rr = ((a * b).sum(-1, keepdim=True) for a, b in ((q64, r64), (q64, q64), (r64, r64)))  # (Q, 1) each
    return (cos.double() + lam * _direction(qc, rc, cc, qr, qq, rr, eps)).float()


def chord_scores_candidates(queries: torch.Tensor, candidates: torch.Tensor, references: torch.Tensor, lam: float,
                            eps: float = EPS) -> torch.Tensor:
    """Chord scores of per-query candidates: queries (Q, D), candidates (Q, n, D), references (Q, D), all
    L2-normalised -> (Q, n)."""
    q, c, r = queries.float(), candidates.float(), references.float()
    cos = (c @ q[:, :, None])[..., 0]  # (Q, n)
    if lam == 0:
        return cos
    q64, c64, r64 = q.double(), c.double(), r.double()
    qc, rc = (c64 @ q64[:, :, None])[..., 0], (c64 @ r64[:, :, None])[..., 0]  # (Q, n)
    cc = (c64 * c64).sum(-1)  # (Q, n)
    qr, qq, rr = ((a * b).sum(-1, keepdim=True) for a, b in ((q64, r64), (q64, q64), (r64, r64)))  # (Q, 1) each
    return (cos.double() + lam * _direction(qc, rc, cc, qr, qq, rr, eps)).float()


def chord_search(queries: torch.Tensor, gallery: torch.Tensor, references: torch.Tensor, lam: float, k: int,
                 shortlist: int | None = None, exclude: torch.Tensor | None = None, chunk: int = 256
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k by Chord score: (scores, gallery indices), each (Q, k), best first.

    Args:
        queries: (Q, D) composed queries. gallery: (N, D). references: (Q, D) each query's reference feature.
        lam: lambda, the weight of the direction term.
        k: how many to return (at most the gallery size, less one with `exclude`).
        shortlist: None rescores the whole gallery (exact); an int rescores only that many cosine top items
            (at least k; 50 or more is sensible), so that any top-k index can supply them.
        exclude: (Q,) one gallery index per query removed from its ranking (e.g. the reference, CIRR protocol).
        chunk: queries scored at once in exact mode.
    """
    n_avail = gallery.shape[0] - (exclude is not None)
    k = min(k, n_avail)
    if shortlist is not None and shortlist < n_avail:
        if shortlist < k:
            raise ValueError(f"shortlist {shortlist} is smaller than k {k}")
        index = ExactIndex(gallery.shape[1], device=gallery.device)
        index.add(gallery)
        _, cand = index.search(queries, shortlist, exclude=exclude)  # (Q, S) by cosine
        scores = chord_scores_candidates(queries, gallery[cand], references, lam)  # (Q, S)
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]  # (Q, k)
        return scores.gather(1, order), cand.gather(1, order)
    out_s, out_i = [], []
    for s in range(0, queries.shape[0], chunk):
        sc = chord_scores(queries[s:s + chunk], gallery, references[s:s + chunk], lam)  # (q, N)
        if exclude is not None:
            sc[torch.arange(sc.shape[0], device=sc.device), exclude[s:s + chunk].to(sc.device)] = float("-inf")
        ids = rank_by_score(sc, k)  # (q, k), ties in gallery order
        out_s.append(sc.gather(1, ids))
        out_i.append(ids)
    return torch.cat(out_s), torch.cat(out_i)
