"""Line plots drawn with PIL, so that a loss curve needs no plotting library."""
from __future__ import annotations

from pathlib import Path

from PIL import Image, ImageDraw

_COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189)]


def plot_curves(path: str | Path, series: dict[str, list[float | None]], title: str = "", xlabel: str = "",
                size: tuple[int, int] = (640, 400)) -> None:
    """Writes a PNG with one line per series; None values are gaps."""
    W, H = size
    left, right, top, bottom = 60, 20, 30, 40
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    vals = [v for s in series.values() for v in s if v is not None]
    n = max((len(s) for s in series.values()), default=0)
    d.text((left, 8), title, fill="black")
    d.rectangle([left, top, W - right, H - bottom], outline="black")
    if vals and n:
        lo, hi = min(vals), max(vals)
        hi = hi if hi > lo else lo + 1.0
        def xy(i: int, v: float) -> tuple[float, float]:
            x = left + (W - left - right) * (i / max(1, n - 1))
            return x, top + (H - top - bottom) * (1 - (v - lo) / (hi - lo))
        for t in range(5):
            v = lo + (hi - lo) * t / 4
            y = xy(0, v)[1]
            d.line([left - 4, y, left, y], fill="black")
            d.text((4, y - 6), f"{v:.3g}", fill="black")
        for c, (name, s) in enumerate(series.items()):
            col = _COLOURS[c % len(_COLOURS)]
            pts = [xy(i, v) for i, v in enumerate(s) if v is not None]
            if len(pts) > 1:
                d.line(pts, fill=col, width=2)
            for p in pts:
                d.ellipse([p[0] - 2, p[1] - 2, p[0] + 2, p[1] + 2], fill=col)
            d.text((W - right - 120, top + 8 + 14 * c), name, fill=col)
    d.text((left + (W - left - right) // 2 - 20, H - bottom + 14), xlabel, fill="black")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
