"""Pure functions that tell an ablation's delta from seed noise.

The deltas are paired: variant and full model trained with the same seed (same initialisation, same data order)
give one delta per seed. A sign counts as reproduced when the mean paired delta has the paper's sign and its
one-sided paired t statistic, mean / (sd / sqrt(n)), reaches the 95 % critical value of Student's t with n - 1
degrees of freedom, over at least 3 seeds. One seed has no spread to compare with; with 2, t(0.95, 1) = 6.31 asks
for deltas nearly 9 times their spread, so a sign needs 3 seeds (t >= 2.92) before it counts, and 5 (t >= 2.13)
to catch a delta about the size of its spread.
"""
from __future__ import annotations

import math

# one-sided 95 % critical values of Student's t, by degrees of freedom
T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812,
       15: 1.753, 20: 1.725, 30: 1.697}
MIN_SEEDS = 3


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1); sd is 0 for one value."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return m, sd


def t_critical(df: int) -> float:
    """The one-sided 95 % critical value for `df` degrees of freedom (the nearest tabled df at or below; 1.645
    beyond 30)."""
    if df < 1:
        raise ValueError("a t test needs at least 2 seeds")
    if df > 30:
        return 1.645
    return T95[max(k for k in T95 if k <= df)]


def paired_t(deltas: list[float]) -> float | None:
    """mean / (sd / sqrt(n)) of the per-seed deltas; None with fewer than 2 (or infinite when they agree
    exactly and are not 0)."""
    n = len(deltas)
    if n < 2:
        return None
    m, sd = mean_sd(deltas)
    if sd <= 1e-9 * max(1.0, abs(m)):  # equal deltas (up to rounding): no spread to compare with
        return 0.0 if m == 0 else math.copysign(math.inf, m)
    return m / (sd / math.sqrt(n))


def sign_verdict(deltas: list[float], paper_sign: int) -> dict:
    """{"agrees": the mean delta has the paper's sign, "counts": it does beyond noise (module docstring),
    "t": the paired t, "needed": the critical value}."""
    m, _ = mean_sd(deltas)
    agrees = m * paper_sign > 0
    t = paired_t(deltas)
    needed = t_critical(len(deltas) - 1) if len(deltas) >= 2 else None
    counts = bool(len(deltas) >= MIN_SEEDS and agrees and t is not None and abs(t) >= needed)
    return {"agrees": agrees, "counts": counts, "t": None if t is None else round(t, 2) if math.isfinite(t) else t,
            "needed": needed}
