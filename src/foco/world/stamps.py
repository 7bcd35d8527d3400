"""Captioned cutout photos ("stamps") as an optional second source of world objects.

The layout is that of Debian's tuxpaint-stamps-default (/usr/share/tuxpaint/stamps): any folder tree of PNG files
with transparent backgrounds, each with a sidecar ``NAME.txt`` whose first line is its caption ("A cat.").
The caption becomes the object's kind ("cat"). PNGs without a sidecar are not captioned cutouts; they are
counted and reported, not used.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from .scene import Stamp

log = logging.getLogger(__name__)
_ARTICLE = re.compile(r"^(a|an|the|some)\s+", re.IGNORECASE)


def stamp_kind(caption_line: str) -> str | None:
    """ "A cat." -> "cat". Returns None for captions that are not a short noun phrase."""
    text = caption_line.strip().rstrip(".!").strip().lower()
    text = _ARTICLE.sub("", text)
    if not text or len(text.split()) > 3 or not re.fullmatch(r"[a-z][a-z \-']*", text):
        return None
    return text


def load_stamps(root: str | Path, max_stamps: int | None = None) -> list[Stamp]:
    """All usable stamps under `root`, sorted by path so that a seed gives the same world."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"stamps folder not found: {root}")
    stamps, uncaptioned, unusable = [], 0, 0
    for png in sorted(root.rglob("*.png")):
        side = png.with_suffix(".txt")
        if not side.exists():
            uncaptioned += 1
            continue
        lines = side.read_text(encoding="utf-8", errors="replace").splitlines()
        kind = stamp_kind(lines[0]) if lines else None
        if kind is None:
            unusable += 1
            continue
        stamps.append(Stamp(path=png.relative_to(root).as_posix(), kind=kind))
    log.info("stamps in %s: %d used, %d without caption, %d with an unusable caption",
             root, len(stamps), uncaptioned, unusable)
    if max_stamps is not None:
        stamps = stamps[:max_stamps]
    if not stamps:
        raise ValueError(f"no captioned stamps under {root} ({uncaptioned} PNGs without a .txt caption)")
    return stamps
