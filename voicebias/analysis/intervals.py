"""Confidence intervals for rates and their differences, shared by both studies.

`wilson` is the score interval of one binomial proportion (Wilson 1927), the interval R's
``prop.test(k, n, correct = FALSE)`` prints; `newcombe_difference` the hybrid score interval of
a difference of two independent proportions built from the two Wilson intervals (Newcombe 1998,
method 10). Both keep their width at 0/n and n/n, where a Wald interval collapses to a point.
See docs/status.md for how the analysis tables use them.
"""

from __future__ import annotations

import math

from scipy import stats

__all__ = ["z_value", "wilson", "newcombe_difference"]


def z_value(confidence: float = 0.95) -> float:
    """The two-sided standard normal quantile of `confidence`.

    Parameters
    ----------
    confidence : float
        Coverage, strictly between 0 and 1.

    Returns
    -------
    float
        z with P(|Z| <= z) = confidence.

    Examples
    --------
    >>> round(z_value(0.95), 6), round(z_value(0.9), 6)
    (1.959964, 1.644854)
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie between 0 and 1, not {confidence!r}")
    return float(stats.norm.ppf(0.5 + confidence / 2))


def wilson(k: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for k successes of n (k may be a sum of item shares).

    Parameters
    ----------
    k : float
        Successes (0 <= k <= n).
    n : int
        Trials; with none the interval is (NaN, NaN).
    confidence : float
        Coverage of the interval.

    Returns
    -------
    tuple
        (low, high), inside [0, 1].

    Examples
    --------
    >>> [round(v, 4) for v in wilson(0, 10)]
    [0.0, 0.2775]
    >>> [round(v, 4) for v in wilson(29, 60)]
    [0.3618, 0.6069]
    """
    if n == 0:
        return math.nan, math.nan
    z = z_value(confidence)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # at 0/n and n/n the bound is exactly 0 or 1 (centre - half cancels to 0 or 1 only up to rounding)
    lo = 0.0 if k <= 0 else max(0.0, centre - half)
    hi = 1.0 if k >= n else min(1.0, centre + half)
    return lo, hi


def newcombe_difference(
    p1: float, lo1: float, hi1: float, p2: float, lo2: float, hi2: float
) -> tuple[float, float, float]:
    """p1 - p2 with Newcombe's hybrid score interval from each proportion's own (Wilson) interval.

    Parameters
    ----------
    p1, lo1, hi1 : float
        The first proportion and its Wilson interval.
    p2, lo2, hi2 : float
        The second proportion and its Wilson interval.

    Returns
    -------
    tuple
        (p1 - p2, low, high).

    Examples
    --------
    >>> (l1, h1), (l2, h2) = wilson(56, 70), wilson(48, 80)
    >>> [round(v, 4) for v in newcombe_difference(56 / 70, l1, h1, 48 / 80, l2, h2)]
    [0.2, 0.0524, 0.3339]
    """
    d = p1 - p2
    return d, d - math.sqrt((p1 - lo1) ** 2 + (hi2 - p2) ** 2), d + math.sqrt((hi1 - p1) ** 2 + (p2 - lo2) ** 2)
