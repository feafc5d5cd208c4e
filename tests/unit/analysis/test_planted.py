"""Simultaneous intervals of the planted-vs-recovered tables: the family, its coverage, the recipes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tests.support.rref import run_r
from voicebias.analysis import planted
from voicebias.analysis.intervals import simultaneous_confidence, wilson
from voicebias.analysis.planted import wald_interval, wilson_interval, with_simultaneous

REPO = Path(__file__).resolve().parents[3]


def test_the_simultaneous_wilson_interval_is_rs_score_interval_at_the_bonferroni_coverage():
    # the two planted rates each outside its own 95 % interval in the embedded default: 7 of 60 misgendered
    # (planted 0.05; 9 values in the drifting system's family) and 15 of 45 passive units (planted 0.2;
    # 2 passive rates)
    r = run_r(
        """
        for (case in list(c(7, 60, 9), c(15, 45, 2))) {
          ci <- prop.test(case[1], case[2], conf.level = 1 - 0.05 / case[3], correct = FALSE)$conf.int
          emit(paste0("ci_", case[1]), ci)
        }
        """
    )
    for k, n, family in ((7, 60, 9), (15, 45, 2)):
        lo, hi = wilson_interval(k, n)(simultaneous_confidence(0.95, family))
        assert (lo, hi) == pytest.approx(r[f"ci_{k}"], rel=1e-9)
    assert wilson(7, 60)[0] > 0.05 and wilson_interval(7, 60)(simultaneous_confidence(0.95, 9))[0] < 0.05
    assert wilson(15, 45)[0] > 0.2 and wilson_interval(15, 45)(simultaneous_confidence(0.95, 2))[0] < 0.2


def test_the_wald_recipe_is_the_normal_or_t_interval_and_a_zero_se_a_point():
    lo, hi = wald_interval(np.log(2.0), 0.5, log=True)(0.99)
    z = stats.norm.ppf(0.995)
    assert (lo, hi) == pytest.approx((2.0 * math.exp(-z * 0.5), 2.0 * math.exp(z * 0.5)))
    assert wald_interval(1.0, 0.2, df=6)(0.95) == pytest.approx((1.0 - 2.446912 * 0.2, 1.0 + 2.446912 * 0.2))
    assert wald_interval(0.0, 0.0, df=float("nan"))(0.999) == (0.0, 0.0)


def test_the_family_is_the_rows_with_a_recipe_and_a_finite_interval_of_positive_width():
    levels = []

    def recipe(lo, hi):
        def at(coverage):
            levels.append(coverage)
            return lo, hi

        return at

    def row(quantity, planted, lo, hi, interval, system="s"):
        return dict(system=system, quantity=quantity, planted=planted, ci_low=lo, ci_high=hi, interval=interval)

    nan = np.nan
    rows = [
        row("a", 0.55, 0.3, 0.5, recipe(0.25, 0.6)),  # outside its own interval, inside the wider simultaneous one
        row("b", 0.0, 0.0, 0.0, recipe(0.0, 0.0)),  # zero width (no variance): a fact, not a draw; not in the family
        row("c", 1.0, 0.9, 0.95, None),  # checked by a tolerance: no recipe
        row("d", 2.0, 1.0, 3.0, recipe(nan, nan)),  # unbounded: inside it when inside its own (they nest) ...
        row("e", 5.0, 1.0, 3.0, recipe(nan, nan)),  # ... and not shown to be inside it otherwise
        row("f", 5.0, nan, nan, recipe(0.0, 9.0)),  # no interval at all
    ]
    # another system's values are its own family: they change nothing in system s
    other = row("g", 0.5, 0.4, 0.6, recipe(0.3, 0.7), system="t")
    out = with_simultaneous([*rows, other], 0.95).set_index("quantity")
    assert levels == pytest.approx([1 - 0.05 / 3] * 3 + [0.95])
    assert out["simultaneous_confidence"].notna().tolist() == [True, False, False, True, True, False, True]
    assert out.loc["g", "simultaneous_confidence"] == 0.95
    assert out.loc["a", ["simultaneous_ci_low", "simultaneous_ci_high"]].tolist() == [0.25, 0.6]
    assert out["planted_in_simultaneous_ci"].tolist() == [True, None, None, True, False, None, True]
    assert "interval" not in out.columns and "interval" in rows[0]  # the caller's rows are left as they were
    assert with_simultaneous([], 0.95).empty


@pytest.mark.parametrize("p, all_inside", [(0.05, 0.9153), (0.1, 0.9500), (0.2, 0.9487), (0.5, 0.9454)])
def test_9_correct_rates_all_lie_in_their_simultaneous_intervals_about_95_percent_of_the_time(p, all_inside):
    """Exact, by summing the binomial: 9 independent rates at 60 items (the size of the drifting
    system's family and of its cells). Against their own 95 % intervals all 9 hold only 62-76 % of
    the time; Wilson's interval covers a little less than nominal in its tail at p = 0.05."""

    def coverage(confidence):
        inside = [lo <= p <= hi for lo, hi in (wilson(x, 60, confidence) for x in range(61))]
        return float(stats.binom.pmf(np.arange(61), 60, p)[inside].sum())

    assert coverage(simultaneous_confidence(0.95, 9)) ** 9 == pytest.approx(all_inside, abs=5e-5)
    assert coverage(0.95) ** 9 < 0.77


def committed(name: str) -> pd.DataFrame:
    return pd.read_csv(REPO / "reports" / "analysis" / f"{name}.csv")


def test_each_s2s_recipe_rebuilds_its_rows_own_interval_by_the_same_method(monkeypatch):
    """At the table's own coverage every simultaneous interval is the row's own interval: the recipes
    are the methods the analysis used (logistic Wald, GLMM t on its df, Wilson, RQ1 t), on the
    embedded default's committed tables."""
    from voicebias.analysis.s2s import planted_vs_recovered

    args = dict(
        odds=committed("describe_odds_ratios"),
        rates=committed("describe_misgender"),
        planted=json.loads((REPO / "reports" / "analysis" / "planted_truth.json").read_text()),
        pooled=committed("rq1_pooled"),
        mixed=committed("rq1_mixed_models"),
        f0_measure="net_f0_median_st",
        glmm=committed("describe_glmm"),
        by_voice=committed("describe_by_voice"),
    )
    out = planted_vs_recovered(**args).sort_values(["system", "quantity"], ignore_index=True)
    # what the analysis stage wrote from the same tables
    mine = committed("planted_vs_recovered").sort_values(["system", "quantity"], ignore_index=True)
    for c in ("simultaneous_confidence", "simultaneous_ci_low", "simultaneous_ci_high"):
        assert np.allclose(out[c].astype(float), mine[c], rtol=1e-7, equal_nan=True), c  # the CSVs hold 10 digits
    flags = "planted_in_simultaneous_ci"
    assert out[flags].astype(str).tolist() == mine[flags].astype(str).tolist()
    family = out[out["simultaneous_confidence"].notna()]
    sizes = family.groupby("system").size().to_dict()
    assert sizes == {"voice_faithful": 6, "content_driven": 5, "mixed": 6, "drifting": 9}
    for system, k in sizes.items():
        assert (family.loc[family["system"] == system, "simultaneous_confidence"] == 1 - 0.05 / k).all()
    kinds = {q.split(":")[0].rsplit("_", 1)[0] if q.startswith("misgender_rate") else q for q in family["quantity"]}
    assert {"odds_ratio_per_step", "odds_ratio_per_step_mixed", "content_weight", "rq1_f0_shift_st"} <= kinds
    monkeypatch.setattr(planted, "simultaneous_confidence", lambda confidence, k: confidence)
    same = planted_vs_recovered(**args)
    same = same[same["simultaneous_confidence"].notna()]
    assert np.allclose(same["simultaneous_ci_low"], same["ci_low"].astype(float), rtol=1e-7, atol=1e-12)
    assert np.allclose(same["simultaneous_ci_high"], same["ci_high"].astype(float), rtol=1e-7, atol=1e-12)
