"""Intervals for rates (voicebias.analysis.intervals): Wilson is pinned to R's prop.test in
test_stats_rref.py; here the published Newcombe example and the behaviour at 0/n and n/n."""

from __future__ import annotations

import math

import pytest

from voicebias.analysis.intervals import newcombe_difference, wilson, z_value


def test_newcombe_hybrid_score_interval_of_the_published_example():
    # Newcombe (1998), Statistics in Medicine 17:873, example (a): 56/70 - 48/80, method 10: 0.0524 to 0.3339
    (l1, h1), (l2, h2) = wilson(56, 70), wilson(48, 80)
    d, lo, hi = newcombe_difference(56 / 70, l1, h1, 48 / 80, l2, h2)
    assert d == pytest.approx(0.2) and lo == pytest.approx(0.0524, abs=1e-4) and hi == pytest.approx(0.3339, abs=1e-4)


@pytest.mark.parametrize("k,n", [(0, 10), (10, 10), (0, 1), (30, 30)])
def test_a_rate_of_none_or_all_keeps_a_width(k, n):
    lo, hi = wilson(k, n)
    assert hi - lo > 0.05 and 0.0 <= lo <= k / n <= hi <= 1.0


def test_no_trials_is_no_interval_and_the_level_is_checked():
    assert all(math.isnan(v) for v in wilson(0, 0))
    assert z_value(0.95) == pytest.approx(1.959963984540054, abs=1e-12)
    with pytest.raises(ValueError):
        z_value(1.0)


def test_koopman_ratio_of_the_published_example_and_the_closed_form_at_all_successes():
    from voicebias.analysis.intervals import koopman_ratio

    # Koopman (1984), Biometrics 40: 513-517: 36/40 against 16/80, 95 %: 2.94 to 7.15
    r, lo, hi = koopman_ratio(36, 40, 16, 80)
    assert r == pytest.approx(4.5) and lo == pytest.approx(2.94, abs=5e-3) and hi == pytest.approx(7.15, abs=5e-3)
    # n1/n1 against n2/n2: the score equation gives n1 / (n1 + z^2) and (n2 + z^2) / n2
    z2 = z_value(0.95) ** 2
    r, lo, hi = koopman_ratio(10, 10, 20, 20)
    assert (
        r == 1.0 and lo == pytest.approx(10 / (10 + z2), rel=1e-10) and hi == pytest.approx((20 + z2) / 20, rel=1e-10)
    )


def test_koopman_ratio_at_none_and_all():
    from voicebias.analysis.intervals import koopman_ratio

    r, lo, hi = koopman_ratio(0, 10, 3, 10)
    assert r == 0.0 and lo == 0.0 and 0.5 < hi < 2.0
    r, lo, hi = koopman_ratio(3, 10, 0, 10)
    assert math.isinf(r) and math.isinf(hi) and 0.5 < lo < 2.0
    r, lo, hi = koopman_ratio(0, 10, 0, 10)
    assert math.isnan(r) and lo == 0.0 and math.isinf(hi)
    with pytest.raises(ValueError, match="0 <= k <= n"):
        koopman_ratio(11, 10, 3, 10)
