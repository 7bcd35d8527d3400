"""The CLI's real-valued options: each a finite number within the range its option documents (the ranges are
`foco.utils.parse`'s, which the server shares), refused with the value and the range otherwise."""
from __future__ import annotations

import argparse


def _float(v: str, ok, refusal: str) -> float:
    from ..utils.parse import ascii_real
    try:
        x = ascii_real(v)  # the one number rule (`foco.utils.parse`): "1_0" is not 10, nor "nan" a number
    except ValueError as exc:
        what = "a finite number" if "finite" in str(exc) else "a number in ASCII decimal"
        raise argparse.ArgumentTypeError(f"{v!r} is not {what}") from None
    if not ok(x):
        raise argparse.ArgumentTypeError(f"{v.strip()} {refusal}")  # as typed: 100.00000000001 is not "100"
    return x


def finite_float(v: str) -> float:
    """argparse type: a finite number (nan and inf are refused: they would train, or score, into NaNs)."""
    return _float(v, lambda x: True, "")


def _positive_at_most(hi: float, what: str):
    def parse(v: str) -> float:
        return _float(v, lambda x: 0 < x <= hi, f"is not a {what} in (0, {hi:g}]")
    return parse


def _nonneg_at_most(hi: float, what: str):
    def parse(v: str) -> float:
        return _float(v, lambda x: 0 <= x <= hi, f"is not a {what} in [0, {hi:g}]")
    return parse


def _ranges():
    from ..utils import parse as p
    return p.MAX_LR, p.MAX_LOSS_WEIGHT, p.MAX_SECONDS, p.MAX_LORA_ALPHA


_LR, _WEIGHT, _SECONDS, _ALPHA = _ranges()
learning_rate = _positive_at_most(_LR, "learning rate")  # argparse types, each within its documented range
loss_weight = _nonneg_at_most(_WEIGHT, "loss weight")  # (`foco.utils.parse`): nothing downstream overflows
seconds = _positive_at_most(_SECONDS, "time in seconds")
wait_seconds = _nonneg_at_most(_SECONDS, "time in seconds")
lora_alpha = _positive_at_most(_ALPHA, "LoRA alpha")


def unit_float(v: str) -> float:
    """argparse type: a finite number in [0, 1] (shares)."""
    return _float(v, lambda x: 0 <= x <= 1, "is not in [0, 1]")


def float_in(lo: float, hi: float, unit: str = ""):
    """argparse type: a finite number in [lo, hi] (a bound the program relies on, e.g. a wait in ms)."""
    def parse(v: str) -> float:
        return _float(v, lambda x: lo <= x <= hi, f"is not between {lo:g} and {hi:g}{unit}")
    return parse
