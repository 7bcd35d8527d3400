"""Training-step speed of FoCo's batched cross-instance losses.

1. The batched step against the per-pair reference (foco.naive) at B = 64 and B = 128, forward + backward,
   timed side by side in one run; the ratio is of medians.
2. Steps/s and peak memory of the batched step at B = 512 (all 511 negatives per anchor, and capped).

    python experiments/bench_train_step.py [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import time

import torch
import torch.nn.functional as F

from foco.train.data import TrainBatch
from foco.train.losses import foco_losses, plan_negatives
from foco.model import ComposedQueryEncoder, FoCoConfig
from foco.naive import losses_per_pair


def batch(B: int, D: int = 256, P: int = 64, K: int = 4, L: int = 24, device: str = "cpu") -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    return TrainBatch(F.normalize(torch.randn(B, D, generator=g), dim=-1).to(device),
                      torch.randn(B, P, D, generator=g).to(device),
                      F.normalize(torch.randn(B, K, D, generator=g), dim=-1).to(device),
                      torch.ones(B, K, dtype=torch.bool, device=device),
                      torch.randn(B, K, L, D, generator=g).to(device),
                      torch.ones(B, K, L, dtype=torch.bool, device=device))


def timed_step(model, b, plan, fn, device) -> float:
    t = time.perf_counter()
    loss = fn(model, b, plan, True)["loss"]
    loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--big-batch", type=int, default=512)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = ComposedQueryEncoder(FoCoConfig(dim=256)).to(a.device)
    res = {"device": a.device, "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    for B in (64, 128):
        b = batch(B, device=a.device)
        plan = plan_negatives(b.local_mask.cpu(), None, torch.Generator().manual_seed(0))
        plan.neg_k, plan.columns = plan.neg_k.to(a.device), plan.columns.to(a.device)
        fast = [timed_step(model, b, plan, foco_losses, a.device) for _ in range(a.repeats + 1)][1:]
        slow = [timed_step(model, b, plan, losses_per_pair, a.device) for _ in range(max(1, a.repeats - 2))]
        res[f"B={B}"] = {"batched_s": round(statistics.median(fast), 3), "per_pair_s": round(statistics.median(slow), 2),
                         "speedup": round(statistics.median(slow) / statistics.median(fast), 1)}
        print(json.dumps(res), flush=True)
    for cap in (None, 63):
        B = a.big_batch
        b = batch(B, device=a.device)
        if a.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        plan = plan_negatives(b.local_mask.cpu(), cap, torch.Generator().manual_seed(0))
        plan.neg_k, plan.columns = plan.neg_k.to(a.device), plan.columns.to(a.device)
        times = [timed_step(model, b, plan, foco_losses, a.device) for _ in range(a.repeats)]
        key = f"B={B}" + ("" if cap is None else f", max_negatives={cap}")
        res[key] = {"steps_per_s": round(1 / statistics.median(times), 3)}
        if a.device == "cuda":
            res[key]["peak_gpu_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        else:
            res[key]["peak_rss_gb_so_far"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
