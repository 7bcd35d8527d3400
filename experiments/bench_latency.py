"""Query latency: composition (F_Aggr + F_Comp) plus exact cosine top-50 search over 10k and 100k gallery vectors.
p50 per single query and per batch of 256 queries, measured in one run.

    python experiments/bench_latency.py
"""
from __future__ import annotations

import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from foco.backbones.base import ImageFeatures, TextFeatures
from foco.index import ExactIndex
from foco.model import ComposedQueryEncoder, FoCoConfig


def main(D: int = 256, P: int = 64, L: int = 12) -> None:
    torch.manual_seed(0)
    model = ComposedQueryEncoder(FoCoConfig(dim=D)).eval()
    res = {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(), "dim": D,
           "patches": P, "text_tokens": L}

    def query(n: int):
        return (ImageFeatures(F.normalize(torch.randn(n, D), dim=-1), torch.randn(n, P, D)),
                TextFeatures(F.normalize(torch.randn(n, D), dim=-1), torch.randn(n, L, D), torch.ones(n, L, dtype=torch.bool)))

    for N in (10_000, 100_000):
        index = ExactIndex(D)
        index.add(F.normalize(torch.randn(N, D), dim=-1))
        for n, reps in ((1, 200), (256, 15)):
            ref, mod = query(n)
            times = []
            for r in range(reps + 3):
                t = time.perf_counter()
                with torch.inference_mode():
                    q = model.encode(ref, mod).query
                    index.search(q, 50)
                if r >= 3:
                    times.append(time.perf_counter() - t)
            res[f"gallery={N}, batch={n}"] = {"p50_ms": round(1000 * statistics.median(times), 2),
                                              "p50_ms_per_query": round(1000 * statistics.median(times) / n, 3)}
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
