"""Planted against recovered: the simultaneous intervals of a reference system's planted truth.

A reference system's planted truth is checked on many values at once (the embedded default's
drifting system has 9 with an interval in the S2S table). Each value's own interval at 95 % misses
it 5 % of the time even when every stage is right, so a correct audit shows chance misses (all 9
inside with probability about 0.95^9 = 0.63). Each table therefore also sets every value beside a
simultaneous interval: the same method at the Bonferroni coverage 1 - (1 - confidence) / k over the
system's k values checked by an interval, so that all k lie inside together with probability at
least `confidence`, whatever the dependence between them. A row's recipe (`wald_interval`,
`wilson_interval`) rebuilds its own interval at any coverage; `with_simultaneous` adds the
simultaneous columns. See docs/audit-card.md, "Planted vs recovered".
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
from scipy import stats

from voicebias.analysis.intervals import simultaneous_confidence, wilson

__all__ = ["PLANTED_HEAD", "SIMULTANEOUS_COLUMNS", "wald_interval", "wilson_interval", "with_simultaneous"]

#: the first columns of the S2S and SC tables: a planted value, its estimate and its own interval
PLANTED_HEAD = ["system", "quantity", "planted", "recovered", "ci_low", "ci_high", "planted_in_ci"]
#: the columns `with_simultaneous` adds
SIMULTANEOUS_COLUMNS = [
    "simultaneous_confidence",
    "simultaneous_ci_low",
    "simultaneous_ci_high",
    "planted_in_simultaneous_ci",
]

Interval = Callable[[float], tuple[float, float]]


def wald_interval(est: float, se: float, df: float = np.inf, log: bool = False) -> Interval:
    """The interval est +- q se at a coverage: q the normal quantile, or Student's t on `df` when
    `df` is finite; exponentiated for `log` (an odds ratio from its log-odds and SE). An SE of 0
    (no variance) gives the point itself at any coverage.

    >>> [round(v, 4) for v in wald_interval(0.0, 1.0)(0.95)]
    [-1.96, 1.96]
    >>> [round(v, 4) for v in wald_interval(0.0, 1.0, df=10)(0.95)]
    [-2.2281, 2.2281]
    """

    def at(confidence: float) -> tuple[float, float]:
        if se == 0:  # no variance: the point itself, at any coverage
            lo = hi = est
        else:
            p = 0.5 + confidence / 2
            q = float(stats.t.ppf(p, df) if np.isfinite(df) else stats.norm.ppf(p))
            lo, hi = est - q * se, est + q * se
        return (float(np.exp(lo)), float(np.exp(hi))) if log else (float(lo), float(hi))

    return at


def wilson_interval(k: float, n: int, to: Callable[[float], float] | None = None) -> Interval:
    """Wilson's interval of k of n at a coverage, mapped through the increasing `to` when given.

    >>> [round(v, 4) for v in wilson_interval(29, 60)(0.95)]
    [0.3618, 0.6069]
    """

    def at(confidence: float) -> tuple[float, float]:
        lo, hi = wilson(k, n, confidence)
        return (to(lo), to(hi)) if to else (lo, hi)

    return at


def with_simultaneous(
    rows: list[dict], confidence: float, planted: str = "planted", family: str = "system"
) -> pd.DataFrame:
    """The table of `rows` with its simultaneous intervals (SIMULTANEOUS_COLUMNS).

    Each row holds its own interval at `confidence` (`ci_low`, `ci_high`) and its recipe under the
    key ``"interval"``: coverage -> (low, high), or None for a row that is not checked by an interval
    (a tolerance, an exact count). A family is the rows of one `family` value (one reference
    system's planted truth, so that adding or changing a system moves no other system's rows) with
    a recipe and a finite interval of positive width (a zero-width interval, no variance, is a fact
    and not a draw). Each of a family's k rows gets its interval at `simultaneous_confidence(
    confidence, k)` and whether the `planted` value lies in it; the other rows get NaN and None.
    A recipe may give NaN bounds where the interval at that coverage is unbounded (Fieller's, when
    the slope is within the critical value of 0). Every method here gives nested intervals, so a
    value inside its own interval is inside the simultaneous one; a value outside its own interval
    and an unbounded simultaneous one counts as outside (it cannot be shown to be inside)."""
    recipes = [r.get("interval") for r in rows]
    out = pd.DataFrame([{c: v for c, v in r.items() if c != "interval"} for r in rows])
    checked = [
        f is not None
        and bool(np.isfinite(r["ci_low"]) and np.isfinite(r["ci_high"]))
        and bool(r["ci_high"] > r["ci_low"])
        for f, r in zip(recipes, rows)
    ]
    sizes: dict = {}
    for c, r in zip(checked, rows):
        sizes[r[family]] = sizes.get(r[family], 0) + c
    levels, lows, highs, inside = [], [], [], []
    for f, c, r in zip(recipes, checked, rows):
        if not c:
            levels.append(np.nan)
            lows.append(np.nan)
            highs.append(np.nan)
            inside.append(None)
            continue
        level = simultaneous_confidence(confidence, sizes[r[family]])
        lo, hi = f(level)
        levels.append(level)
        lows.append(lo)
        highs.append(hi)
        if r["ci_low"] <= r[planted] <= r["ci_high"]:
            inside.append(True)
        else:
            inside.append(bool(np.isfinite(lo) and np.isfinite(hi) and lo <= r[planted] <= hi))
    if len(rows):
        out["simultaneous_confidence"] = levels
        out["simultaneous_ci_low"] = lows
        out["simultaneous_ci_high"] = highs
        out["planted_in_simultaneous_ci"] = inside
    return out
