"""Confidence intervals for rates and their differences, shared by both studies.

`wilson` is the score interval of one binomial proportion (Wilson 1927), the interval R's
``prop.test(k, n, correct = FALSE)`` prints; `newcombe_difference` the hybrid score interval of
a difference of two independent proportions built from the two Wilson intervals (Newcombe 1998,
method 10); `koopman_ratio` the score interval of a ratio of two independent proportions
(Koopman 1984). All keep their width at 0/n and n/n, where a Wald interval collapses to a point.
See docs/status.md and docs/disaggregated.md for how the analysis tables use them.
`simultaneous_confidence` is the per-interval coverage that makes k intervals hold all k of their
values together (Bonferroni), as the planted-vs-recovered tables use it.
"""

from __future__ import annotations

import math

from scipy import optimize, stats

__all__ = ["z_value", "simultaneous_confidence", "wilson", "newcombe_difference", "koopman_ratio"]


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


def simultaneous_confidence(confidence: float, k: int) -> float:
    """The coverage each of `k` intervals needs so that all `k` hold their values together with
    probability at least `confidence` (Bonferroni: 1 - (1 - confidence) / k).

    A table of k values each checked against its own 95 % interval misses at least one of them with
    probability 1 - 0.95^k even when every estimate is right (0.88 at k = 42); checked against
    intervals at this coverage, at most 1 - `confidence`, whatever the dependence between them.

    Parameters
    ----------
    confidence : float
        Family-wise coverage, strictly between 0 and 1.
    k : int
        Number of intervals, at least 1.

    Returns
    -------
    float
        The per-interval coverage.

    Examples
    --------
    >>> simultaneous_confidence(0.95, 1), round(simultaneous_confidence(0.95, 40), 6)
    (0.95, 0.99875)
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie between 0 and 1, not {confidence!r}")
    if k < 1:
        raise ValueError(f"a family holds at least one interval, not {k!r}")
    return 1 - (1 - confidence) / k


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


def _koopman_statistic(theta: float, k1: float, n1: int, k2: float, n2: int) -> float:
    """Score statistic of H0: p1 = theta p2 (Pearson's chi-square of the two samples with the
    proportions at their maximum-likelihood values under H0)."""
    num = (k1 / n1 - theta * k2 / n2) ** 2
    if num == 0.0:
        return 0.0
    # under H0, p2 is the smaller root of theta (n1 + n2) p^2 - (theta (n1 + k2) + k1 + n2) p + k1 + k2
    b = theta * (n1 + k2) + k1 + n2
    c = k1 + k2
    p2 = 2.0 * c / (b + math.sqrt(max(b * b - 4.0 * theta * (n1 + n2) * c, 0.0)))
    p1 = theta * p2
    var = p1 * (1.0 - p1) / n1 + theta * theta * p2 * (1.0 - p2) / n2
    return num / var if var > 0 else math.inf


def koopman_ratio(k1: float, n1: int, k2: float, n2: int, confidence: float = 0.95) -> tuple[float, float, float]:
    """p1 / p2 (p1 = k1 / n1, p2 = k2 / n2) with Koopman's (1984) score interval.

    The interval holds every ratio theta that the score test of p1 = theta p2 does not reject:
    chi-square(theta) <= z^2. The bound is 0 where k1 = 0 and infinite where k2 = 0; with
    k1 = k2 = 0 the ratio is NaN and the interval (0, inf). k may be a sum of item shares.

    Parameters
    ----------
    k1, n1, k2, n2 : float, int
        Successes and trials of each sample (0 <= k <= n, n >= 1).
    confidence : float
        Coverage of the interval.

    Returns
    -------
    tuple
        (p1 / p2, low, high).

    Examples
    --------
    >>> [round(v, 3) for v in koopman_ratio(36, 40, 16, 80)]  # Koopman (1984), Biometrics 40: 513
    [4.5, 2.94, 7.152]
    >>> [round(v, 4) for v in koopman_ratio(10, 10, 10, 10)]  # n1 / (n1 + z^2), (n2 + z^2) / n2
    [1.0, 0.7225, 1.3841]
    """
    if not (0 <= k1 <= n1 and 0 <= k2 <= n2 and n1 >= 1 and n2 >= 1):
        raise ValueError(f"koopman_ratio needs 0 <= k <= n and n >= 1, got {k1}/{n1} and {k2}/{n2}")
    z2 = z_value(confidence) ** 2
    p1, p2 = k1 / n1, k2 / n2
    if k1 == 0 and k2 == 0:
        return math.nan, 0.0, math.inf
    ratio = p1 / p2 if k2 > 0 else math.inf

    def excess(log_theta: float) -> float:
        return _koopman_statistic(math.exp(log_theta), k1, n1, k2, n2) - z2

    # the statistic is 0 at the estimate and grows toward 0 and infinity: bracket each side by doubling
    centre = math.log(ratio) if math.isfinite(ratio) and ratio > 0 else math.log((k1 + 0.5) / n1 / ((k2 + 0.5) / n2))

    def bound(direction: float) -> float:
        step = 1.0
        while excess(centre + direction * step) < 0:
            step *= 2.0
            if step > 2048:
                return math.inf if direction > 0 else 0.0
        lo, hi = sorted((centre, centre + direction * step))
        return math.exp(optimize.brentq(excess, lo, hi, xtol=1e-14, rtol=4 * 2.220446049250313e-16))

    low = 0.0 if k1 == 0 else bound(-1.0)
    high = math.inf if k2 == 0 else bound(1.0)
    return ratio, low, high
