"""Approximate FAISS indexes against the exact one: recall@10 and build time on random unit vectors.

    python experiments/bench_faiss.py [--n 100000] [--dim 256] [--queries 1000] [--types Flat,IVF1024,Flat,...]

Recall@10 is |approximate top 10 ∩ exact top 10| / 10, averaged over the queries; the exact top 10 comes from
`foco.index.ExactIndex` (the twin the tests hold the flat index to). Random unit vectors have no cluster structure,
which is the hard case for IVF and PQ; real image features score higher. Types are separated by ';'.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from foco.index import ExactIndex
from foco.search.vectors import build_vector_index, search_vectors, set_search_params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--types", default="Flat;IVF1024,Flat;HNSW32;IVF1024,PQ32")
    ap.add_argument("--nprobe", type=int, default=16)
    ap.add_argument("--ef-search", type=int, default=64)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.n, a.dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = rng.standard_normal((a.queries, a.dim)).astype(np.float32)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    exact = ExactIndex(a.dim)
    exact.add(torch.from_numpy(x))
    t0 = time.perf_counter()
    _, truth = exact.search(torch.from_numpy(q), 10)
    exact_s = time.perf_counter() - t0
    truth = truth.numpy()
    ids = np.arange(a.n, dtype=np.int64)
    rows = []
    print(f"{a.n} random unit vectors, D = {a.dim}, {a.queries} queries; exact search (torch) {exact_s:.2f} s")
    print("| index | build s | search ms/query | recall@10 |\n|---|---|---|---|")
    for factory in a.types.split(";"):
        t0 = time.perf_counter()
        index = build_vector_index(ids, x, factory)
        build = time.perf_counter() - t0
        params = set_search_params(index, nprobe=a.nprobe, ef_search=a.ef_search)
        t0 = time.perf_counter()
        _, got = search_vectors(index, q, 10)
        per_query = 1000 * (time.perf_counter() - t0) / a.queries
        recall = float(np.mean([len(set(g) & set(t)) / 10 for g, t in zip(got, truth)]))
        rows.append({"index": factory, "build_s": round(build, 2), "search_ms_per_query": round(per_query, 3),
                     "recall@10": round(recall, 4), **params})
        print(f"| {factory} {params or ''} | {build:.2f} | {per_query:.3f} | {recall:.3f} |", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
