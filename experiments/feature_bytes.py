"""Disk per image and per caption of the feature store: measured on caches, and computed from the layout for the
paper's shapes (ViT-L/14), with CC3M's total in the old and the new layout (a projection: its arithmetic is
`layout`).

    .venv/bin/python experiments/feature_bytes.py --cache OLD_TRAIN_CACHE --cache NEW_TRAIN_CACHE

Measured: the bytes of a cache's image shards per image, and of its text shards per text, split in the new layout
into texts stored with tokens (the contextual captions) and without (local captions, captions).

Computed (a projection from the layout, fp16): an image is a global (D) and P patches (P x D). A text is a global
(D); in the old layout every text also has its tokens (padded to its shard's longest, about its own length since
texts are sorted by length) and a one-byte mask per position; in the new layout only a contextual caption has
tokens and every text an 8-byte offset. CC3M: 3.3M images, K local/context pairs per caption (the paper's 3-5),
each text distinct.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from safetensors import safe_open


def measure(cache: Path) -> dict:
    out = {"cache": str(cache)}
    for kind in ("images", "texts"):
        files = sorted((cache / kind).glob("shard-*.safetensors"))
        n = sum(len(json.loads(f.with_suffix(".json").read_text())["ids"]) for f in files)
        size = sum(f.stat().st_size + f.with_suffix(".json").stat().st_size for f in files)
        out[kind] = {"count": n, "bytes": size, "bytes_per_item": round(size / max(1, n))}
    files = sorted((cache / "texts").glob("shard-*.safetensors"))
    with safe_open(str(files[0]), "pt") as f:
        ragged = "offsets" in f.keys()
    if ragged:  # tokens per text, from the offsets
        lengths = []
        for path in files:
            with safe_open(str(path), "pt") as f:
                lengths.append(np.diff(f.get_tensor("offsets").numpy()))
                D = f.get_slice("global").get_shape()[1]
        lengths = np.concatenate(lengths)
        with_tokens = lengths > 0
        out["texts"].update({"layout": "ragged", "with_tokens": int(with_tokens.sum()),
                             "mean_tokens_of_those": round(float(lengths[with_tokens].mean()), 2),
                             "bytes_per_text_without_tokens": D * 2 + 8,
                             "bytes_per_text_with_tokens": round(D * 2 + 8 + float(lengths[with_tokens].mean()) * D * 2)})
    else:
        with safe_open(str(files[0]), "pt") as f:
            out["texts"]["layout"] = f"padded, L = {f.get_slice('tokens').get_shape()[1]} in shard 0"
    return out


def layout(D: int, P: int, context_tokens: float, local_tokens: float, K: float, n_images: float = 3.3e6) -> dict:
    """Bytes from the layouts (fp16). Old: every text stores its tokens (texts are sorted by length before they
    are sharded, so a shard pads to about its texts' own length) and a 1-byte mask per token. New: only a context
    stores tokens, and every text an 8-byte offset."""
    image = (D + P * D) * 2
    old_local, old_context = D * 2 + local_tokens * (D * 2 + 1), D * 2 + context_tokens * (D * 2 + 1)
    new_local, new_context = D * 2 + 8, D * 2 + 8 + context_tokens * D * 2
    old_pair, new_pair = old_local + old_context, new_local + new_context
    return {"D": D, "P": P, "context_tokens": context_tokens, "local_tokens": local_tokens, "K": K,
            "bytes_per_image": image, "old_bytes_per_pair": round(old_pair), "new_bytes_per_pair": round(new_pair),
            "old_bytes_per_local": round(old_local), "new_bytes_per_local": new_local,
            "old_bytes_per_context": round(old_context), "new_bytes_per_context": round(new_context),
            "images_TB": round(n_images * image / 1e12, 3),
            "old_total_TB": round(n_images * (image + K * old_pair) / 1e12, 3),
            "new_total_TB": round(n_images * (image + K * new_pair) / 1e12, 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache", action="append", default=[], help="a feature cache folder (repeatable)")
    p.add_argument("--out", default=None, help="write the figures as JSON here")
    a = p.parse_args()
    res = {"measured": [measure(Path(c)) for c in a.cache],
           # ViT-L/14 at 224 px: D 768, 256 patches; a contextual caption ~20 tokens (the CC3M figure), a
           # local caption ~8 (a noun phrase with CLIP's start and end tokens); K = 3 and 5
           "vit_l14_projection": [layout(768, 256, 20, 8, K) for K in (3, 5)]}
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
