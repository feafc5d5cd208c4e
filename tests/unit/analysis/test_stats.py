"""Describe statistics against closed forms, hand counts and planted effects."""

import numpy as np
import pandas as pd
import pytest

from voicebias.analysis.stats import detect_separation, fisher_misaligned_vs_neutral, misgender_rates, odds_ratio_per_step
from voicebias.systems.reference import planted_p_female, planted_truth


def table(counts):
    """counts: {(pole, voice): (n_female, n_male)} -> describe rows."""
    rows = []
    for (pole, voice), (nf, nm) in counts.items():
        rows += [{"lang": "en", "pole": pole, "voice_gender": voice, "judged_gender": "female"}] * nf
        rows += [{"lang": "en", "pole": pole, "voice_gender": voice, "judged_gender": "male"}] * nm
    return pd.DataFrame(rows)


def test_or_matches_closed_form_when_logits_are_linear():
    # P(female) = 0.1, 0.5, 0.9 by content step in both voices: the logits
    # -ln 9, 0, ln 9 are exactly linear, so the MLE reproduces them and the
    # odds ratio per step is exactly 9 (voice effect exactly 0).
    counts = {}
    for voice in ("male", "female"):
        counts[("masculine", voice)] = (2, 18)
        counts[("neutral", voice)] = (10, 10)
        counts[("feminine", voice)] = (18, 2)
    res = odds_ratio_per_step(table(counts)).iloc[0]
    assert res["fit_status"] == "ok"
    assert res["odds_ratio"] == pytest.approx(9.0, abs=1e-6)
    assert res["n"] == 120 and res["n_excluded"] == 0
    # Wald CI from the closed-form SE is symmetric on the log scale
    assert np.log(res["ci_high"]) - np.log(9) == pytest.approx(np.log(9) - np.log(res["ci_low"]), abs=1e-9)


def test_noncompliant_answers_are_excluded_and_counted():
    df = table({("masculine", "male"): (1, 4), ("feminine", "female"): (4, 1), ("neutral", "male"): (2, 3),
                ("neutral", "female"): (3, 2), ("masculine", "female"): (2, 3), ("feminine", "male"): (3, 2)})
    df = pd.concat([df, pd.DataFrame([{"lang": "en", "pole": "neutral", "voice_gender": "male", "judged_gender": "none"}] * 3)])
    res = odds_ratio_per_step(df).iloc[0]
    assert res["n"] == 30 and res["n_excluded"] == 3


def test_complete_separation_is_reported_not_estimated():
    # a voice-faithful system with no errors: voice predicts the answer perfectly
    counts = {(p, v): ((10, 0) if v == "female" else (0, 10)) for p in ("masculine", "neutral", "feminine") for v in ("male", "female")}
    res = odds_ratio_per_step(table(counts)).iloc[0]
    assert res["fit_status"] == "perfect separation (complete)"
    assert np.isnan(res["odds_ratio"]) and np.isnan(res["p_value"])


def test_quasi_complete_separation_is_reported():
    # content-driven with no errors; neutral content split evenly
    counts = {}
    for v in ("male", "female"):
        counts[("masculine", v)] = (0, 10)
        counts[("neutral", v)] = (5, 5)
        counts[("feminine", v)] = (10, 0)
    res = odds_ratio_per_step(table(counts)).iloc[0]
    assert res["fit_status"] == "perfect separation (quasi-complete)"


def test_detect_separation_none_for_overlapping_data():
    X = np.column_stack([np.ones(6), [0, 0, 1, 1, 2, 2]])
    assert detect_separation(X, np.array([0, 1, 0, 1, 0, 1])) == "none"
    assert detect_separation(X, np.array([0, 0, 0, 1, 1, 1])) == "quasi-complete"
    assert detect_separation(X, np.array([0, 0, 1, 1, 1, 1])) == "complete"


def test_misgender_rates_hand_counts():
    df = table({("feminine", "male"): (3, 1), ("masculine", "female"): (0, 2), ("neutral", "male"): (1, 3),
                ("feminine", "female"): (5, 0), ("masculine", "male"): (1, 4)})
    r = misgender_rates(df).set_index(["lang", "cell_type"])
    # misaligned: male voice+feminine content 3 of 4 called female, female voice+masculine 2 of 2 called male
    assert r.loc[("en", "misaligned"), "misgendered"] == 5 and r.loc[("en", "misaligned"), "n"] == 6
    assert r.loc[("en", "misaligned"), "rate"] == 5 / 6
    assert r.loc[("en", "aligned"), "rate"] == 1 / 10
    assert r.loc[("en", "neutral"), "rate"] == 1 / 4
    assert r.loc[("ALL", "misaligned"), "rate"] == 5 / 6


def test_fisher_matches_known_value():
    # fisher.test(matrix(c(3,1,1,3),2)) in R: p-value = 0.4857, odds ratio (sample) = 9
    rates = pd.DataFrame([
        {"lang": "en", "cell_type": "misaligned", "n": 4, "misgendered": 3},
        {"lang": "en", "cell_type": "neutral", "n": 4, "misgendered": 1},
    ])
    res = fisher_misaligned_vs_neutral(rates).iloc[0]
    assert res["p_value"] == pytest.approx(0.4857, abs=1e-4)
    assert res["odds_ratio"] == pytest.approx(9.0)


def simulate(params, n_per_cell, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for pole in ("masculine", "neutral", "feminine"):
        for v in ("male", "female"):
            p = planted_p_female(params, pole, v)
            for _ in range(n_per_cell):
                rows.append({"lang": "en", "pole": pole, "voice_gender": v,
                             "judged_gender": "female" if rng.random() < p else "male"})
    return pd.DataFrame(rows)


def reference_params(**kw):
    """A complete reference-system parameter block (every key planted_truth reads)."""
    return {"error_rate": 0.0, "neutral_p_female": 0.5, "noncompliance_rate": 0.0, "drift_st": 0.0, **kw}


@pytest.mark.parametrize("params", [
    reference_params(rule="content", error_rate=0.05),
    reference_params(rule="voice", error_rate=0.05),
    reference_params(rule="mixed", error_rate=0.05, content_weight=0.5),
])
def test_planted_odds_ratio_recovered(params):
    truth = planted_truth(params)
    res = odds_ratio_per_step(simulate(params, 400, seed=7)).iloc[0]
    assert res["ci_low"] <= truth["odds_ratio_per_step"] <= res["ci_high"]
    # with 2400 rows the estimate lands within 25% of the planted value on the OR scale
    assert res["odds_ratio"] == pytest.approx(truth["odds_ratio_per_step"], rel=0.25)


def test_planted_truth_closed_forms():
    assert planted_truth(reference_params(rule="content", error_rate=0.05))["odds_ratio_per_step"] == pytest.approx(19.0, rel=1e-6)
    assert planted_truth(reference_params(rule="voice", error_rate=0.1))["odds_ratio_per_step"] == pytest.approx(1.0, abs=1e-6)
    mixed = planted_truth(reference_params(rule="mixed", content_weight=0.3))
    assert mixed["misgender_rate"]["misaligned"] == pytest.approx(0.3)
    assert planted_truth(reference_params(rule="voice"))["separable"] is True


def two_by_two(a, b, c, d):
    """x=1: a successes, b failures; x=0: c successes, d failures."""
    X = np.array([[1.0, 1.0]] * (a + b) + [[1.0, 0.0]] * (c + d))
    y = np.array([1.0] * a + [0.0] * b + [1.0] * c + [0.0] * d)
    return X, y


@pytest.mark.parametrize("cells", [(0, 10, 7, 3), (5, 5, 2, 8), (12, 0, 0, 9)])
def test_firth_equals_haldane_corrected_log_odds_ratio(cells):
    # For one binary covariate the Firth estimate is the log odds ratio with 1/2
    # added to every cell (closed form), finite even when a cell is empty.
    from voicebias.analysis.stats import firth_coefficient

    a, b, c, d = cells
    X, y = two_by_two(*cells)
    res = firth_coefficient(X, y, 1)
    assert res["coef"] == pytest.approx(np.log((a + 0.5) * (d + 0.5) / ((b + 0.5) * (c + 0.5))), abs=1e-6)
    assert res["ci_low"] < res["coef"] < res["ci_high"] and np.isfinite(res["ci_low"]) and np.isfinite(res["ci_high"])


def test_firth_is_offered_under_separation():
    counts = {(p, v): ((10, 0) if v == "female" else (0, 10)) for p in ("masculine", "neutral", "feminine") for v in ("male", "female")}
    res = odds_ratio_per_step(table(counts)).iloc[0]
    assert res["fit_status"].startswith("perfect separation")
    # content carries no information: the penalised estimate sits at OR 1 with a CI covering it
    assert res["firth_odds_ratio"] == pytest.approx(1.0, abs=1e-6)
    assert res["firth_ci_low"] < 1 < res["firth_ci_high"] and res["firth_p_value"] > 0.99
