"""`foco world verify`: read every manifest and decode every image of a world folder, failing loudly."""
from __future__ import annotations

from pathlib import Path

from ..utils.io import ImageLoadError, load_image, read_json
from ..utils.progress import progress
from .generate import BENCH_SPLITS, PAIR_SPLITS, PROTOCOLS
from .manifest import load_benchmark, load_pairs


def verify_world(root: str | Path) -> dict:
    """Returns counts; raises ManifestError or ImageLoadError naming every bad file (all of them, not the first)."""
    root = Path(root)
    read_json(root / "world.json")
    images: list[Path] = []
    counts = {}
    for split in PAIR_SPLITS:
        pairs = load_pairs(root, split)
        counts[split] = len(pairs)
        images += [p.image for p in pairs]
    for split in BENCH_SPLITS:
        for protocol in PROTOCOLS:
            b = load_benchmark(root, split, protocol)
            counts[f"{split}/{protocol}"] = {"queries": len(b.query_ids), "gallery": len(b.gallery_ids)}
            images += b.gallery_images
    bad = []
    for path in progress(images, desc="decoding images"):
        try:
            load_image(path)
        except ImageLoadError as exc:
            bad.append(str(exc))
    if bad:
        raise ImageLoadError(f"{len(bad)} of {len(images)} images are missing or corrupt:\n  " + "\n  ".join(bad[:20])
                             + ("\n  ..." if len(bad) > 20 else ""))
    counts["images"] = len(images)
    return counts
