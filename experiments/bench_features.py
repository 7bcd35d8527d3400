"""Feature-extraction throughput of a backbone: images/s and texts/s, median of repeated timed batches.

    python experiments/bench_features.py --backbone world:pretrained --world runs/quickstart/world
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from foco import create_backbone
from foco.utils.io import load_image
from foco.world.manifest import load_pairs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backbone", required=True)
    ap.add_argument("--world", required=True)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    bb = create_backbone(a.backbone)
    pairs = load_pairs(a.world, "backbone_val")
    images = [load_image(p.image) for p in pairs[: a.batch_size]]
    texts = [p.caption for p in pairs[: a.batch_size]]
    contexts = [pr.context for p in pairs for pr in p.decomposition.pairs][: a.batch_size]
    bb.encode_images(images[:8]); bb.encode_texts(texts[:8])  # warm-up (lazy loads)
    res = {}
    for name, fn, batch in (("images", bb.encode_images, images), ("captions", bb.encode_texts, texts),
                            ("contexts", bb.encode_texts, contexts)):
        times = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            fn(batch)
            times.append(time.perf_counter() - t)
        res[f"{name}_per_s"] = round(len(batch) / statistics.median(times), 1)
    res.update(batch_size=a.batch_size, repeats=a.repeats, torch_threads=torch.get_num_threads(),
               cpu=platform.processor() or platform.machine())
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
