"""Values typed on a command line that are a number or one reserved word ("val", "auto")."""
from __future__ import annotations

import math

MAX_CHORD = 100.0  # Chord's lambda, wherever it is given (foco search, foco serve): beyond it the direction term
#                    alone orders the shortlist, and within it every score stays finite


def number_or_word(value: str, word: str, flag: str, lo: float = -math.inf, hi: float = math.inf) -> float | str:
    """`word` itself, or a finite number in [lo, hi]; a ValueError naming `flag` otherwise."""
    if value == word:
        return value
    bounds = "" if (lo, hi) == (-math.inf, math.inf) else f" in [{lo:g}, {hi:g}]"
    try:
        x = float(value)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or not lo <= x <= hi:
        raise ValueError(f"{flag}: expected a finite number{bounds} or {word!r}, got {value!r}")
    return x
