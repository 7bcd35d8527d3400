"""Figures a person can read, in the style of the paper's Figure 4: one row per method with the reference, F_Aggr's
attention over it (methods that have one) and the top-k retrieved images, each ground-truth target outlined in
green; and a grouped bar chart of a metric per edit type and method.

matplotlib (`pip install foco[plot]`) draws them; without it the retrieval figure falls back to a plain PIL grid
and the bar chart is skipped with a note.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw

from ..utils.plot import have_matplotlib, pyplot

log = logging.getLogger(__name__)
GREEN = (0, 170, 0)


@dataclass
class FigureRow:
    """One method's answer to one query."""

    method: str
    results: list[Image.Image]  # the top-k gallery images, best first
    correct: list[bool]  # (k,) whether each is a ground-truth target
    attention: torch.Tensor | None = None  # (P,) F_Aggr's head-averaged attention over the reference's patches


def attention_map(attention: torch.Tensor, side: int) -> np.ndarray:
    """The (P,) attention reshaped to its square grid, min-max scaled and resized to (side, side) in [0, 1]."""
    g = int(round(attention.numel() ** 0.5))
    a = attention.detach().float().cpu().reshape(g, g).numpy()
    a = (a - a.min()) / max(float(a.max() - a.min()), 1e-8)
    heat = Image.fromarray((a * 255).astype(np.uint8), "L").resize((side, side), Image.BICUBIC)
    return np.asarray(heat, dtype=np.float32) / 255.0


def attention_overlay(image: Image.Image, attention: torch.Tensor, side: int = 192) -> Image.Image:
    """Blends a red heat map of the (P,) attention over the image (the PIL fallback, and the server's PNG)."""
    heat = Image.fromarray((attention_map(attention, side) * 255).astype(np.uint8), "L")
    base = image.convert("RGB").resize((side, side), Image.NEAREST)
    red = Image.new("RGB", (side, side), (255, 0, 0))
    return Image.composite(red, base, heat.point(lambda v: int(v * 0.6)))


def retrieval_figure(path: str | Path, reference: Image.Image, text: str, rows: Sequence[FigureRow],
                     title: str = "", side: int = 128) -> None:
    """Writes the figure of one query: a row per method (its name on the left), green borders on ground truths.
    The cells are composed into one image (each `side` pixels square) and drawn on one axes: a figure of one axes
    per cell spent most of its time building axes (about 1 s a figure)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not have_matplotlib():
        _retrieval_figure_pil(path, reference, text, rows)
        return
    plt = pyplot()
    k = max(len(r.results) for r in rows)
    pad, label, header, footer = 10, 120, 64, 6  # pixels
    W, H = label + (side + pad) * (2 + k), header + (side + pad) * len(rows) + footer
    canvas = np.full((H, W, 3), 255, dtype=np.uint8)  # (H, W, 3)
    ref = _cell(reference, side)
    jet = plt.get_cmap("jet")

    def put(cell: np.ndarray, r: int, c: int, outline: bool = False) -> None:
        y, x = header + r * (side + pad), label + c * (side + pad)
        if outline:
            canvas[y - 4:y + side + 4, x - 4:x + side + 4] = (0, 170, 0)
        canvas[y:y + side, x:x + side] = cell

    for r, row in enumerate(rows):
        put(ref, r, 0)
        if row.attention is not None:
            heat = jet(attention_map(row.attention, side))[..., :3] * 255  # (side, side, 3)
            put((0.55 * ref + 0.45 * heat).astype(np.uint8), r, 1)
        for c, (im, ok) in enumerate(zip(row.results, row.correct)):
            put(_cell(im, side), r, 2 + c, outline=ok)
    dpi = 100
    fig = plt.figure(figsize=(W / dpi, H / dpi), dpi=dpi)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.imshow(canvas, interpolation="nearest")
    ax.set_axis_off()
    for r, row in enumerate(rows):
        ax.text(label - pad, header + r * (side + pad) + side / 2, row.method, fontsize=10, fontweight="bold",
                ha="right", va="center")
        if row.attention is None:
            ax.text(label + (side + pad) + side / 2, header + r * (side + pad) + side / 2, "no attention\nmap",
                    ha="center", va="center", fontsize=7, color="grey")
    heads = ["reference", "F_Aggr attention" if any(r.attention is not None for r in rows) else ""]
    for c, head in enumerate(heads + [f"top {c + 1}" for c in range(k)]):
        ax.text(label + c * (side + pad) + side / 2, header - 6, head, fontsize=8, ha="center", va="bottom")
    ax.text(W / 2, 4, (title + "\n" if title else "") + f'"{text}"   (green border: a ground-truth target)',
            fontsize=9, ha="center", va="top")
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def _cell(image: Image.Image, side: int) -> np.ndarray:
    """(side, side, 3) uint8: the image resized without smoothing, as the world's flat shapes are best seen."""
    return np.asarray(image.convert("RGB").resize((side, side), Image.NEAREST))


def _retrieval_figure_pil(path: Path, reference: Image.Image, text: str, rows: Sequence[FigureRow],
                          side: int = 96) -> None:
    pad, header, label = 8, 28, 90
    k = max(len(r.results) for r in rows)
    W = label + (side + pad) * (k + 2) + pad
    H = header + (side + pad) * len(rows) + pad
    fig = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(fig)
    d.text((pad, 6), f'"{text}"  (green border: a ground-truth target)', fill="black")
    for r, row in enumerate(rows):
        y = header + r * (side + pad)
        d.text((pad, y + side // 2 - 6), row.method, fill="black")
        fig.paste(reference.convert("RGB").resize((side, side), Image.NEAREST), (label, y))
        if row.attention is not None:
            fig.paste(attention_overlay(reference, row.attention, side), (label + side + pad, y))
        for c, (im, ok) in enumerate(zip(row.results, row.correct)):
            x = label + (side + pad) * (c + 2)
            fig.paste(im.convert("RGB").resize((side, side), Image.NEAREST), (x, y))
            if ok:
                d.rectangle([x - 3, y - 3, x + side + 2, y + side + 2], outline=GREEN, width=3)
    fig.save(path)


def edit_type_chart(path: str | Path, by_type: dict[str, dict[str, float]], metric: str = "R@1",
                    title: str = "") -> bool:
    """A grouped bar chart: edit types on the x axis, one bar per method ({method: {edit type: value}}). Returns
    False (and says why) when matplotlib is missing."""
    if not have_matplotlib():
        log.info("matplotlib is not installed: skipping %s (pip install foco[plot] draws it)", path)
        return False
    plt = pyplot()
    methods = list(by_type)
    types = sorted({t for v in by_type.values() for t in v})
    width = 0.8 / max(1, len(methods))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(types) + 2), 4.2), dpi=110)
    x = np.arange(len(types))
    for m, name in enumerate(methods):
        vals = [by_type[name].get(t, np.nan) for t in types]
        ax.bar(x - 0.4 + width * (m + 0.5), vals, width, label=name, color=f"C{m % 10}")
    ax.set_xticks(x, types)
    ax.set_ylabel(metric)
    ax.set_xlabel("edit type")
    ax.set_title(title or f"{metric} by edit type", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, ncol=min(4, len(methods)))
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True
