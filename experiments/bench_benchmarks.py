"""Speed of the official-benchmark path: (a) gallery feature extraction (images/s, global features only, through
`foco.features.extract_images`: PNG decoding + encoding + shard writing), and (b) exact top-50 ranking of a
CIRCO-sized gallery (123,403 random unit vectors) for 800 queries (CIRCO test), at the backbone's width and at
768 (ViT-L/14). Medians of repeats; prints JSON with the machine.

    python experiments/bench_benchmarks.py --backbone world:pretrained --world runs/quickstart/world
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import replace

import torch

from foco import create_backbone
from foco.benchmarks.world import read_world
from foco.features import ExtractConfig, extract_images
from foco.index import ExactIndex

CIRCO_GALLERY = 123_403  # images in COCO 2017 unlabeled


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def extraction_rate(backbone, world: str, n_images: int, batch_size: int, repeats: int) -> float:
    """Images/s of a fresh gallery cache (no patches) of the first `n_images` world test gallery images."""
    bench = read_world(world, "test", ("single",))[0]
    items = [(g, bench.images[g].path) for g in bench.gallery_ids()][:n_images]
    cfg = replace(ExtractConfig(batch_size=batch_size), patches=False)
    with tempfile.TemporaryDirectory() as tmp:
        extract_images(backbone, items[:8], os.path.join(tmp, "warm"), cfg)  # warm-up
        runs = iter(range(repeats))
        seconds = _median_time(lambda: extract_images(backbone, items, os.path.join(tmp, f"r{next(runs)}"), cfg),
                               repeats)
    return len(items) / seconds


def ranking_time(dim: int, gallery_size: int, n_queries: int, k: int, repeats: int) -> float:
    """Seconds to rank `n_queries` against `gallery_size` random unit vectors of width `dim`, exact top-k."""
    g = torch.Generator().manual_seed(0)
    index = ExactIndex(dim)
    index.add(torch.nn.functional.normalize(torch.randn(gallery_size, dim, generator=g), dim=-1))
    queries = torch.nn.functional.normalize(torch.randn(n_queries, dim, generator=g), dim=-1)
    index.search(queries[:8], k)  # warm-up
    return _median_time(lambda: index.search(queries, k), repeats)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backbone", required=True)
    ap.add_argument("--world", required=True, help="a world folder: its test gallery images are encoded")
    ap.add_argument("--images", type=int, default=512, help="gallery images encoded per repeat")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--gallery-size", type=int, default=CIRCO_GALLERY)
    ap.add_argument("--queries", type=int, default=800)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--dims", default=None, help="comma-separated widths (default: the backbone's and 768)")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    backbone = create_backbone(a.backbone)
    dims = [int(d) for d in a.dims.split(",")] if a.dims else list(dict.fromkeys([backbone.embed_dim, 768]))
    res = {
        "extract_images_per_s": round(extraction_rate(backbone, a.world, a.images, a.batch_size, a.repeats), 1),
        "rank_s": {str(d): round(ranking_time(d, a.gallery_size, a.queries, a.k, a.repeats), 3) for d in dims},
        "gallery_size": a.gallery_size, "queries": a.queries, "k": a.k, "images": a.images,
        "repeats": a.repeats, "backbone": a.backbone, "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "cpu": cpu_name(), "python": platform.python_version(),
    }
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
