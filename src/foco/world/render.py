"""Draws a `Scene` with PIL: a textured background, then each object in its layout cell.

Scenes are drawn at `SUPERSAMPLE` times the final size and downsampled, so edges are anti-aliased. Every object
gets a one-pixel outline of contrasting luminance, so a white shape stays visible on snow.

A `Look` says how one picture of a scene is drawn beyond what the scene says: the background's shade, texture and
pattern phase, and each object's scale within its size class, rotation and tint. `Look()` is the world's own
drawing, pixel for pixel; the `restaged` protocol (`restaged.py`) draws its gallery with sampled looks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageChops, ImageDraw, ImageFilter

from .scene import Scene, WorldObject
from .vocab import BACKGROUNDS, COLOURS, GRID, IMAGE_SIZE, MARKS, SIZES

SUPERSAMPLE = 3


@dataclass(frozen=True)
class Look:
    """How a picture of a scene is drawn, beyond the scene. The default is the world's own drawing.

    Attributes:
        shade: the background's brightness, a multiplier (1: as the vocabulary gives it).
        texture: seed of the background's texture (dots, flakes); None: the background's one fixed texture.
        phase: horizontal shift of the background's pattern (and of a horizon's height), in [-1, 1].
        scales: per object (in the scene's order), its side as a multiple of its size class's side; () = all 1.
        angles: per object, its rotation in degrees (counter-clockwise); () = all 0.
        tints: per object, an RGB offset added to a shape's fill (stamps keep their photo colours); () = none.
    """

    shade: float = 1.0
    texture: int | None = None
    phase: float = 0.0
    scales: tuple[float, ...] = ()
    angles: tuple[float, ...] = ()
    tints: tuple[tuple[int, int, int], ...] = ()

    def of(self, i: int) -> tuple[float, float, tuple[int, int, int]]:
        """(scale, angle, tint) of object i."""
        return (self.scales[i] if self.scales else 1.0, self.angles[i] if self.angles else 0.0,
                self.tints[i] if self.tints else (0, 0, 0))

    def to_dict(self) -> dict[str, Any]:
        return {"shade": self.shade, "texture": self.texture, "phase": self.phase, "scales": list(self.scales),
                "angles": list(self.angles), "tints": [list(t) for t in self.tints]}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "Look":
        return Look(shade=float(d["shade"]), texture=None if d["texture"] is None else int(d["texture"]),
                    phase=float(d["phase"]), scales=tuple(float(x) for x in d["scales"]),
                    angles=tuple(float(x) for x in d["angles"]),
                    tints=tuple((int(t[0]), int(t[1]), int(t[2])) for t in d["tints"]))


def _star(n: int, inner: float) -> list[tuple[float, float]]:
    pts = []
    for i in range(2 * n):
        r = 1.0 if i % 2 == 0 else inner
        a = -math.pi / 2 + i * math.pi / n
        pts.append((r * math.cos(a), r * math.sin(a)))
    return pts


def _regular(n: int, phase: float = -math.pi / 2) -> list[tuple[float, float]]:
    return [(math.cos(phase + 2 * math.pi * i / n), math.sin(phase + 2 * math.pi * i / n)) for i in range(n)]


def _heart() -> list[tuple[float, float]]:
    pts = []
    for i in range(60):
        t = 2 * math.pi * i / 60
        x = 16 * math.sin(t) ** 3
        y = 13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t)
        pts.append((x / 17.0, -y / 17.0 + 0.1))
    return pts


# Unit polygons in [-1, 1]^2 (y down). Circle and crescent are drawn as ellipses.
_POLYGONS: dict[str, list[tuple[float, float]]] = {
    "square": [(-0.85, -0.85), (0.85, -0.85), (0.85, 0.85), (-0.85, 0.85)],
    "triangle": [(0.0, -1.0), (1.0, 0.85), (-1.0, 0.85)],
    "star": _star(5, 0.42),
    "heart": _heart(),
    "diamond": [(0.0, -1.0), (0.7, 0.0), (0.0, 1.0), (-0.7, 0.0)],
    "hexagon": _regular(6, 0.0),
    "cross": [(-0.3, -1), (0.3, -1), (0.3, -0.3), (1, -0.3), (1, 0.3), (0.3, 0.3), (0.3, 1), (-0.3, 1),
              (-0.3, 0.3), (-1, 0.3), (-1, -0.3), (-0.3, -0.3)],
    "arrow": [(-1, -0.3), (0.2, -0.3), (0.2, -0.8), (1, 0), (0.2, 0.8), (0.2, 0.3), (-1, 0.3)],
}


def shape_mask(kind: str, side: int) -> Image.Image:
    """An "L" mask of a procedural shape filling a side x side box."""
    mask = Image.new("L", (side, side), 0)
    draw = ImageDraw.Draw(mask)
    half = side / 2.0
    if kind == "circle":
        draw.ellipse([0, 0, side - 1, side - 1], fill=255)
    elif kind == "crescent":
        draw.ellipse([0, 0, side - 1, side - 1], fill=255)
        off = side * 0.38
        draw.ellipse([off, -side * 0.1, side - 1 + off, side * 0.9], fill=0)
    elif kind in _POLYGONS:
        draw.polygon([(half + x * (half - 1), half + y * (half - 1)) for x, y in _POLYGONS[kind]], fill=255)
    else:
        raise ValueError(f"unknown shape kind {kind!r}")
    return mask


# Where a mark goes inside each shape: (centre x, centre y, half side) of a square in the shape's unit box [-1, 1]^2
# (y down), chosen to lie in the shape's thick part (a triangle's lower half, a crescent's left horn, an arrow's
# head); what still sticks out is cut off by the shape's mask.
_MARK_BOX: dict[str, tuple[float, float, float]] = {
    "circle": (0.0, 0.0, 0.5), "square": (0.0, 0.0, 0.55), "triangle": (0.0, 0.32, 0.36), "star": (0.0, 0.04, 0.32),
    "heart": (0.0, 0.0, 0.45), "diamond": (0.0, 0.0, 0.4), "hexagon": (0.0, 0.0, 0.55), "cross": (0.0, 0.0, 0.42),
    "crescent": (-0.55, 0.22, 0.32), "arrow": (0.35, 0.0, 0.32),
}


def mark_mask(kind: str, mark: str, side: int) -> Image.Image:
    """An "L" mask of the instance mark `mark` of a `kind` shape filling a side x side box, inside the shape."""
    if mark not in MARKS:
        raise ValueError(f"unknown instance mark {mark!r}; choose from {', '.join(MARKS)}")
    if kind not in _MARK_BOX:
        raise ValueError(f"unknown shape kind {kind!r}")
    mx, my, mh = _MARK_BOX[kind]
    half = side / 2.0
    r = max(2.0, mh * (half - 1))  # half side of the mark's box, pixels
    ox, oy = half + mx * (half - 1), half + my * (half - 1)

    def pt(u: float, v: float) -> tuple[float, float]:  # mark unit coordinates [-1, 1]^2 -> pixels
        return (ox + u * r, oy + v * r)

    def box(u0: float, v0: float, u1: float, v1: float) -> list[float]:
        return [*pt(u0, v0), *pt(u1, v1)]

    out = Image.new("L", (side, side), 0)
    draw = ImageDraw.Draw(out)
    stroke = max(2, int(round(0.38 * r)))
    if mark == "dot":
        draw.ellipse(box(-0.6, -0.6, 0.6, 0.6), fill=255)
    elif mark == "ring":
        draw.ellipse(box(-0.95, -0.95, 0.95, 0.95), outline=255, width=stroke)
    elif mark == "bar":
        draw.rectangle(box(-0.95, -0.24, 0.95, 0.24), fill=255)
    elif mark == "slash":
        draw.line([pt(-0.85, 0.85), pt(0.85, -0.85)], fill=255, width=stroke + 1)
    elif mark == "two dots":
        draw.ellipse(box(-0.95, -0.4, -0.15, 0.4), fill=255)
        draw.ellipse(box(0.15, -0.4, 0.95, 0.4), fill=255)
    else:  # corner: an L along the box's left and bottom edges
        draw.rectangle(box(-0.95, -0.95, -0.5, 0.95), fill=255)
        draw.rectangle(box(-0.95, 0.5, 0.95, 0.95), fill=255)
    return ImageChops.multiply(out, shape_mask(kind, side))


@lru_cache(maxsize=4096)
def _stamp_rgba(path: str, side: int) -> Image.Image:
    """A stamp cut to its alpha bounding box and fitted into a side x side box (aspect kept)."""
    try:
        with Image.open(path) as im:
            im = im.convert("RGBA")
    except Exception as exc:  # PIL raises several types for bad files
        raise ValueError(f"cannot read stamp image {path}: {exc}") from exc
    bbox = im.getchannel("A").getbbox() or (0, 0, im.width, im.height)
    im = im.crop(bbox)
    scale = side / max(im.width, im.height)
    im = im.resize((max(1, round(im.width * scale)), max(1, round(im.height * scale))), Image.LANCZOS)
    out = Image.new("RGBA", (side, side), (0, 0, 0, 0))
    out.paste(im, ((side - im.width) // 2, (side - im.height) // 2))
    return out


@lru_cache(maxsize=64)
def background_image(name: str, size: int, shade: float = 1.0, texture: int | None = None,
                     phase: float = 0.0) -> Image.Image:
    """The background `name` at side `size`; `shade`, `texture` and `phase` as in `Look` (defaults: the world's)."""
    spec = BACKGROUNDS[name]
    top, bottom = np.array(spec["top"], float), np.array(spec["bottom"], float)
    t = np.linspace(0.0, 1.0, size)[:, None, None]
    arr = np.broadcast_to(top * (1 - t) + bottom * t, (size, size, 3)).copy()
    # a fixed texture per background, unless a look seeds another
    rng = np.random.default_rng(sum(map(ord, name)) if texture is None else [texture, sum(map(ord, name))])
    pattern = spec["pattern"]
    if pattern == "horizon":
        line = size // 2 + int(round(phase * 0.15 * size))  # the horizon moves up or down with the phase
        arr[line:] = np.array(spec["bottom"], float)
        arr[:line] = np.array(spec["top"], float)
    elif pattern == "dots":
        for _ in range(40):
            y, x = rng.integers(0, size, 2)
            arr[y:y + 2, x:x + 2] = 255
    elif pattern == "flakes":
        for _ in range(60):
            y, x = rng.integers(0, size, 2)
            arr[y:y + 2, x:x + 2] = 200
    elif pattern == "bricks":
        h = size // 8
        arr[::h] = 210
        for r in range(8):
            off = (r % 2) * h
            arr[r * h:(r + 1) * h, off::2 * h] = 210
    elif pattern == "trunks":
        for x in range(0, size, size // 6):
            arr[:, x:x + size // 40 + 1] = (90, 60, 30)
    elif pattern == "blades":
        arr[::4] *= 0.85
    elif pattern == "dunes":
        yy, xx = np.mgrid[0:size, 0:size]
        arr *= (0.9 + 0.1 * np.sin(xx / size * 12 + yy / size * 5))[..., None]
    elif pattern == "waves":
        yy, xx = np.mgrid[0:size, 0:size]
        arr *= (0.85 + 0.15 * np.sin(yy / size * 30 + np.sin(xx / size * 8)))[..., None]
    shift = int(round(phase * size / 2))
    if shift and pattern != "horizon":
        arr = np.roll(arr, shift, axis=1)  # the pattern slides sideways (the gradient is vertical: unchanged)
    if shade != 1.0:
        arr *= shade
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")


def _outline_colour(rgb: tuple[int, int, int]) -> tuple[int, int, int]:
    lum = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]
    return (20, 20, 20) if lum > 110 else (235, 235, 235)


def _draw_object(canvas: Image.Image, obj: WorldObject, stamps_root: Path | None, scale: float = 1.0,
                 angle: float = 0.0, tint: tuple[int, int, int] = (0, 0, 0)) -> None:
    big = canvas.width
    cell = big // GRID
    side = max(4, int(round(cell * SIZES[obj.size] * scale)))
    row, col = divmod(obj.cell, GRID)
    cx = col * cell + cell // 2 + obj.jitter[0] * SUPERSAMPLE
    cy = row * cell + cell // 2 + obj.jitter[1] * SUPERSAMPLE
    if obj.stamp is not None:
        if stamps_root is None:
            raise ValueError(f"scene uses stamp {obj.stamp!r} but no stamps folder was given")
        rgba = _stamp_rgba(str(stamps_root / obj.stamp), side)
        if angle:
            rgba = rgba.rotate(angle, resample=Image.BICUBIC, expand=True)
        mask, fill = rgba.getchannel("A"), rgba.convert("RGB")
        outline = (20, 20, 20)
    else:
        mask = shape_mask(obj.kind, side)
        if obj.mark is not None:  # drawn last, in the outline's colour; an object without one is drawn as ever
            mark = mark_mask(obj.kind, obj.mark, side)
        if angle:
            mask = mask.rotate(angle, resample=Image.BICUBIC, expand=True)
            if obj.mark is not None:
                mark = mark.rotate(angle, resample=Image.BICUBIC, expand=True)
        colour = tuple(int(np.clip(c + d, 0, 255)) for c, d in zip(COLOURS[obj.colour], tint))
        fill = Image.new("RGB", mask.size, colour)
        outline = _outline_colour(COLOURS[obj.colour])
    x0, y0 = cx - mask.width // 2, cy - mask.height // 2
    ring = mask.filter(ImageFilter.MaxFilter(2 * SUPERSAMPLE - 1 if SUPERSAMPLE > 1 else 3))
    canvas.paste(Image.new("RGB", mask.size, outline), (x0, y0), ring)
    canvas.paste(fill, (x0, y0), mask)
    if obj.stamp is None and obj.mark is not None:
        canvas.paste(Image.new("RGB", mark.size, outline), (x0, y0), mark)


def render_scene(scene: Scene, stamps_root: str | Path | None = None, size: int = IMAGE_SIZE,
                 look: Look | None = None) -> Image.Image:
    """Renders `scene` as an RGB image of side `size`, drawn with `look` (default: the world's own drawing)."""
    root = Path(stamps_root) if stamps_root is not None else None
    look = look or Look()
    for name in ("scales", "angles", "tints"):
        if getattr(look, name) and len(getattr(look, name)) != len(scene.objects):
            raise ValueError(f"a look gives {len(getattr(look, name))} {name} for a scene of "
                             f"{len(scene.objects)} objects")
    canvas = background_image(scene.background, size * SUPERSAMPLE, look.shade, look.texture, look.phase).copy()
    for i, obj in enumerate(scene.objects):
        _draw_object(canvas, obj, root, *look.of(i))
    return canvas.resize((size, size), Image.LANCZOS)
