"""Training curves: drawn with matplotlib when it is installed (`pip install foco[plot]`), else with a small PIL
fallback that draws the same lines without axis niceties."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Sequence

from PIL import Image, ImageDraw

log = logging.getLogger(__name__)
_COLOURS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189)]


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend (figures are files, never windows)."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    return plt


def _smooth(ys: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_losses(path: str | Path, steps: Sequence[dict], keys: Sequence[str], title: str = "",
                phase_key: str = "stage") -> None:
    """One line per loss in `keys` against the global step (records of train_steps.jsonl: {"step", phase_key, key:
    value, ...}); raw values faint, a moving average solid, and a dashed line where each phase starts."""
    keys = [k for k in keys if any(r.get(k) is not None for r in steps)]
    if not steps or not keys:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    starts = [(r["step"], r.get(phase_key)) for i, r in enumerate(steps)
              if i == 0 or r.get(phase_key) != steps[i - 1].get(phase_key)]
    if not have_matplotlib():
        xs = [r["step"] for r in steps]
        plot_curves(path, {k: [r.get(k) for r in steps] for k in keys}, title, xlabel="step", x=xs)
        return
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    window = max(1, len(steps) // 50)
    for c, k in enumerate(keys):
        pts = [(r["step"], r[k]) for r in steps if r.get(k) is not None]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        colour = f"C{c}"
        ax.plot(xs, ys, color=colour, alpha=0.25, linewidth=0.8)
        ax.plot(xs, _smooth(ys, window), color=colour, linewidth=1.8, label=f"{k} (mean of {window} steps)"
                if window > 1 else k)
    for x, phase in starts:
        if phase is None:
            continue
        ax.axvline(x, color="grey", linestyle="--", linewidth=0.8)
        ax.text(x, 1.0, f" {phase_key} {phase}", transform=ax.get_xaxis_transform(), va="top", fontsize=8,
                color="dimgrey")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_curves(path: str | Path, series: dict[str, list[float | None]], title: str = "", xlabel: str = "",
                size: tuple[int, int] = (640, 400), x: Sequence[float] | None = None) -> None:
    """The PIL fallback: a PNG with one line per series (None values are gaps) over positions `x` (default
    0, 1, ...)."""
    W, H = size
    left, right, top, bottom = 60, 20, 30, 40
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    vals = [v for s in series.values() for v in s if v is not None]
    n = max((len(s) for s in series.values()), default=0)
    xs = list(x) if x is not None else list(range(n))
    d.text((left, 8), title, fill="black")
    d.rectangle([left, top, W - right, H - bottom], outline="black")
    if vals and n:
        lo, hi = min(vals), max(vals)
        hi = hi if hi > lo else lo + 1.0
        x0, x1 = xs[0], xs[-1] if xs[-1] > xs[0] else xs[0] + 1

        def xy(i: int, v: float) -> tuple[float, float]:
            return (left + (W - left - right) * (xs[i] - x0) / (x1 - x0),
                    top + (H - top - bottom) * (1 - (v - lo) / (hi - lo)))
        for t in range(5):
            v = lo + (hi - lo) * t / 4
            yy = xy(0, v)[1]
            d.line([left - 4, yy, left, yy], fill="black")
            d.text((4, yy - 6), f"{v:.3g}", fill="black")
        for c, (name, s) in enumerate(series.items()):
            col = _COLOURS[c % len(_COLOURS)]
            pts = [xy(i, v) for i, v in enumerate(s) if v is not None]
            if len(pts) > 1:
                d.line(pts, fill=col, width=1)
            d.text((W - right - 120, top + 8 + 14 * c), name, fill=col)
        d.text((left, H - bottom + 2), f"{x0:g}", fill="black")
        d.text((W - right - 30, H - bottom + 2), f"{x1:g}", fill="black")
    d.text((left + (W - left - right) // 2 - 20, H - bottom + 14), xlabel, fill="black")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
