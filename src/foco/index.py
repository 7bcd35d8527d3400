"""Exact cosine top-k over a gallery of normalised vectors (torch). FAISS indexes will share this interface."""
from __future__ import annotations

import torch


class ExactIndex:
    """`add` normalised (N, D) vectors; `search(q, k)` returns (scores, indices), each (Q, k), best first."""

    def __init__(self, dim: int, device: str | torch.device = "cpu"):
        self.dim = dim
        self.vectors = torch.empty(0, dim, device=device)  # (N, D) where the search runs

    def add(self, vectors: torch.Tensor) -> None:
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"expected (N, {self.dim}) vectors, got {tuple(vectors.shape)}")
        self.vectors = torch.cat([self.vectors, vectors.float().to(self.vectors.device)])

    def __len__(self) -> int:
        return self.vectors.shape[0]

    def scores(self, queries: torch.Tensor) -> torch.Tensor:
        """(Q, D) -> (Q, N) cosine similarities."""
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"expected (Q, {self.dim}) queries, got {tuple(queries.shape)}")
        return queries.float().to(self.vectors.device) @ self.vectors.t()

    def search(self, queries: torch.Tensor, k: int, exclude: torch.Tensor | None = None, chunk: int = 1024
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k per query, best first; equal scores rank in gallery order (as `metrics.rank_by_score`).
        `exclude` (Q,) removes one gallery index per query (e.g. the reference)."""
        k = min(k, len(self) - (exclude is not None))
        out_s, out_i = [], []
        for s in range(0, queries.shape[0], chunk):
            sc = self.scores(queries[s:s + chunk])  # (q, N)
            if exclude is not None:
                sc[torch.arange(sc.shape[0], device=sc.device), exclude[s:s + chunk].to(sc.device)] = float("-inf")
            values, indices = _stable_topk(sc, k)
            out_s.append(values)
            out_i.append(indices)
        return torch.cat(out_s), torch.cat(out_i)


def _stable_topk(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, N) -> top-k (values, indices), each (q, k), best first and ties in index order. torch.topk leaves the
    order of equal scores unspecified: rows whose (k+1)-th best score equals the k-th (equal scores on both sides
    of the cut) get a full stable sort, then every top k is reordered by (score descending, index ascending)."""
    if k == 0:
        return scores[:, :0], torch.empty(scores.shape[0], 0, dtype=torch.long, device=scores.device)
    top = torch.topk(scores, min(k + 1, scores.shape[1]), dim=1)  # (q, k+1): one more, to see ties at the cut
    idx = top.indices[:, :k]  # (q, k)
    if top.values.shape[1] > k:
        tied = top.values[:, k] == top.values[:, k - 1]  # (q,)
        if tied.any():
            idx[tied] = torch.sort(scores[tied], dim=1, descending=True, stable=True).indices[:, :k]
    idx = idx.sort(dim=1).values  # index order, so that the stable sort below breaks ties by index
    values = scores.gather(1, idx)
    order = torch.sort(values, dim=1, descending=True, stable=True).indices
    return values.gather(1, order), idx.gather(1, order)
