"""Exact cosine top-k over a gallery of normalised vectors (torch). FAISS indexes will share this interface."""
from __future__ import annotations

import torch


class ExactIndex:
    """`add` normalised (N, D) vectors; `search(q, k)` returns (scores, indices), each (Q, k), best first."""

    def __init__(self, dim: int):
        self.dim = dim
        self.vectors = torch.empty(0, dim)

    def add(self, vectors: torch.Tensor) -> None:
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise ValueError(f"expected (N, {self.dim}) vectors, got {tuple(vectors.shape)}")
        self.vectors = torch.cat([self.vectors, vectors.float()])

    def __len__(self) -> int:
        return self.vectors.shape[0]

    def scores(self, queries: torch.Tensor) -> torch.Tensor:
        """(Q, D) -> (Q, N) cosine similarities."""
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise ValueError(f"expected (Q, {self.dim}) queries, got {tuple(queries.shape)}")
        return queries.float() @ self.vectors.t()

    def search(self, queries: torch.Tensor, k: int, exclude: torch.Tensor | None = None, chunk: int = 1024
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k per query; `exclude` (Q,) removes one gallery index per query (e.g. the reference)."""
        k = min(k, len(self) - (exclude is not None))
        out_s, out_i = [], []
        for s in range(0, queries.shape[0], chunk):
            sc = self.scores(queries[s:s + chunk])  # (q, N)
            if exclude is not None:
                sc[torch.arange(sc.shape[0]), exclude[s:s + chunk]] = float("-inf")
            top = torch.topk(sc, k, dim=1)
            out_s.append(top.values)
            out_i.append(top.indices)
        return torch.cat(out_s), torch.cat(out_i)
