"""`foco world export --format webdataset`: the world's image-caption pairs as img2dataset-style tar shards, so
that the corpus path (decompose, features, training from shards) is tested end to end."""
from __future__ import annotations

import io
from pathlib import Path

from ..corpora.webdataset import write_shards


def export_world_pairs(world: str | Path, split: str, out: str | Path, shard_size: int = 1000) -> dict:
    """The world's image-caption pairs of `split` as img2dataset-style shards (key = running number; the world's
    pair id is in the metadata)."""
    from .manifest import load_pairs
    from PIL import Image
    pairs = load_pairs(world, split)
    samples = []
    for n, p in enumerate(pairs):
        data = Path(p.image).read_bytes()
        with Image.open(io.BytesIO(data)) as im:
            w, h = im.size
        key = f"{n:09d}"
        samples.append((key, data, Path(p.image).suffix.lower(), p.caption,
                        {"key": key, "caption": p.caption, "width": w, "height": h, "status": "success",
                         "world_id": p.id}))
    paths = write_shards(samples, out, shard_size)
    from ..utils.ownership import removable
    mine = {p.name for p in paths}
    for stale in removable(out, ("[0-9][0-9][0-9][0-9][0-9].tar",)):  # an earlier export's, at another size (never
        if stale.name not in mine:                                     # a file the user held there)
            stale.unlink()
    last = len(paths) - 1
    return {"samples": len(samples), "shards": len(paths),
            "pattern": str(Path(out) / ("{00000..%05d}.tar" % last if last else "00000.tar"))}
