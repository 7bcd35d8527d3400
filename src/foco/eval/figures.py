"""Figures in the style of the paper's Figure 4: the reference with F_Aggr's attention overlaid, the modification
text, and the top-5 retrieved images (the ground truth outlined in green)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw


def attention_overlay(image: Image.Image, attention: torch.Tensor, side: int = 192) -> Image.Image:
    """Blends a red heat map of the (P,) attention, reshaped to its square grid, over the image."""
    g = int(round(attention.numel() ** 0.5))
    a = attention.detach().float().reshape(g, g).numpy()
    a = (a - a.min()) / max(float(a.max() - a.min()), 1e-8)
    heat = Image.fromarray((a * 255).astype(np.uint8), "L").resize((side, side), Image.BICUBIC)
    base = image.convert("RGB").resize((side, side), Image.NEAREST)
    red = Image.new("RGB", (side, side), (255, 0, 0))
    return Image.composite(red, base, heat.point(lambda v: int(v * 0.6)))


def retrieval_figure(path: str | Path, reference: Image.Image, attention: torch.Tensor | None, text: str,
                     results: Sequence[Image.Image], correct: Sequence[bool], side: int = 128) -> None:
    pad, header = 8, 28
    n = len(results)
    lead = 2 if attention is not None else 1  # the plain reference, then the reference under the attention map
    W = pad + (side + pad) * (n + lead) + pad
    H = header + side + pad * 2 + 16
    fig = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(fig)
    d.text((pad, 6), f'"{text}"', fill="black")
    fig.paste(reference.convert("RGB").resize((side, side), Image.NEAREST), (pad, header))
    d.text((pad, header + side + 2), "reference", fill="black")
    if attention is not None:
        fig.paste(attention_overlay(reference, attention, side), (pad + side + pad, header))
        d.text((pad + side + pad, header + side + 2), "F_Aggr attention", fill="black")
    for r, (im, ok) in enumerate(zip(results, correct)):
        x = pad + (side + pad) * (r + lead) + pad
        fig.paste(im.convert("RGB").resize((side, side), Image.NEAREST), (x, header))
        if ok:
            d.rectangle([x - 3, header - 3, x + side + 2, header + side + 2], outline=(0, 170, 0), width=3)
        d.text((x, header + side + 2), f"top {r + 1}", fill="black")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.save(path)
