"""What several command groups share: argument groups, value parsing, printing."""
from __future__ import annotations

import argparse
from pathlib import Path


def float_or_val(v: str | None) -> float | str | None:
    """A number, or "val" (choose it on the val split), or None."""
    if v is None or v == "val":
        return v
    try:
        return float(v)
    except ValueError:
        raise ValueError(f"expected a number or 'val', got {v!r}") from None


def checkpoint_backbone(checkpoint: str | Path | None) -> str | None:
    """The backbone spec a FoCo checkpoint records (foco.json), or None."""
    if not checkpoint:
        return None
    from ..model.encoder import checkpoint_meta
    return checkpoint_meta(checkpoint).get("backbone")


def add_decomposition_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--decompositions", default=None,
                   help="SQLite store written by `foco decompose` (default: the world's oracle decompositions)")
    p.add_argument("--decomposer", default="oracle",
                   help="which decomposer's results to read from the store: a name or a settings id")


def print_table(title: str, metrics: dict) -> None:
    print(f"\n| {title} | value |\n|---|---|")
    for k, v in metrics.items():
        print(f"| {k} | {v:.2f} |" if isinstance(v, float) else f"| {k} | {v} |")
