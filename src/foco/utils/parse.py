"""The one number rule for values typed on a command line or sent to the server: integers in ASCII digits within a
documented range, finite reals within one, or one reserved word ("val", "auto"). Every range here is one an option
of foco documents; within it nothing downstream overflows.
"""
from __future__ import annotations

import math
import re

MAX_CHORD = 100.0  # Chord's lambda, wherever it is given (foco eval, search, serve): beyond it the direction term
#                    alone orders the shortlist, and within it every score stays finite
MAX_BOX_BETA = 100.0  # |beta| of box anchoring: beyond it the box alone decides F_Aggr's attention, and within it
#                       the attention logits stay finite
MAX_LR = 10.0  # a learning rate (every trainer's --lr*): AdamW's step is at most lr per weight, so within it a step
#               stays finite; a rate near it already diverges, and the loop stops on the first non-finite loss
MAX_LOSS_WEIGHT = 1000.0  # a loss term's weight (--preserve-weight, --image-weight, ...): with sigmoid and
#                          InfoNCE losses (at most a few hundred at a batch of 512) the sum stays far inside fp32
MAX_SECONDS = 86400.0  # a wait or timeout in seconds (--timeout, --backoff, --commit-seconds): one day; beyond it a
#                        socket or sleep call overflows the platform's time types
MAX_LORA_ALPHA = 1e4  # LoRA's alpha (its update is scaled by alpha / rank)
MAX_SEED = 2 ** 32 - 1  # a training or generation seed: numpy's and torch's generators take it as it is
INT64 = (-2 ** 63, 2 ** 63 - 1)
_INT = re.compile(r"[+-]?[0-9]+")
_REAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def ascii_integer(value: object, lo: int = INT64[0], hi: int = INT64[1]) -> int:
    """An integer written in ASCII digits (an optional sign; never "²" or other Unicode digits) within [lo, hi];
    a ValueError saying what was expected otherwise (the caller names the flag or field)."""
    text = str(value).strip()
    if not _INT.fullmatch(text):
        raise ValueError(f"expected an integer in ASCII digits, got {value!r}")
    if len(text.lstrip("+-")) > 20 or not lo <= int(text) <= hi:
        raise ValueError(f"expected an integer in [{lo}, {hi}], got {value!r}")
    return int(text)


def number_or_word(value: str, word: str, flag: str, lo: float = -math.inf, hi: float = math.inf) -> float | str:
    """`word` itself, or a finite number in [lo, hi]; a ValueError naming `flag` otherwise."""
    if value == word:
        return value
    bounds = "" if (lo, hi) == (-math.inf, math.inf) else f" in [{lo:g}, {hi:g}]"
    try:
        x = ascii_real(value)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x) or not lo <= x <= hi:
        raise ValueError(f"{flag}: expected a finite number{bounds} or {word!r}, got {value!r}")
    return x


def ascii_real(value: object, lo: float = -math.inf, hi: float = math.inf) -> float:
    """A real number written in ASCII decimal ("0.5", "-3", "1e-4"; never "1_0", "0x1", "nan", "inf" or Unicode
    digits), finite and within [lo, hi]; a ValueError saying what was expected otherwise (the caller names the flag
    or field). Surrounding spaces are allowed."""
    text = str(value).strip()
    if not _REAL.fullmatch(text):
        try:
            x = float(text)
        except ValueError:
            x = None
        if x is not None and not math.isfinite(x):
            raise ValueError(f"expected a finite number, got {value!r}")
        raise ValueError(f"expected a number in ASCII decimal (e.g. 0.5, 12, 1e-3), got {value!r}")
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"expected a finite number, got {value!r}")
    if not lo <= x <= hi:
        raise ValueError(f"expected a number in [{lo:g}, {hi:g}], got {value!r}")
    return x


def parse_box(value: object) -> tuple[float, float, float, float]:
    """A box "x0,y0,x1,y1" in pixels of an image: four ASCII decimals (`ascii_real`), x0 < x1 and y0 < y1, none
    negative. The one parser of a box, on the command line and the server alike; a ValueError saying what is wrong
    otherwise (the caller names the flag or field)."""
    if not isinstance(value, str):
        raise ValueError(f"expected x0,y0,x1,y1 as text, got {type(value).__name__}")
    parts = value.split(",")
    if len(parts) != 4:
        raise ValueError(f"expected four numbers x0,y0,x1,y1, got {len(parts)} in {value!r}")
    try:
        x0, y0, x1, y1 = (ascii_real(v, 0.0, 1e6) for v in parts)
    except ValueError as exc:
        raise ValueError(f"expected four numbers x0,y0,x1,y1 in pixels (0 to 1e6), got {value!r}: {exc}") from None
    if not (x0 < x1 and y0 < y1):
        raise ValueError(f"expected x0 < x1 and y0 < y1, got {value!r}")
    return x0, y0, x1, y1
