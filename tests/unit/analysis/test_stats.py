"""Describe statistics against closed forms, hand counts and planted effects."""

import numpy as np
import pandas as pd
import pytest

from tests.support.stats import table
from voicebias.analysis.stats import (
    detect_separation,
    fisher_misaligned_vs_neutral,
    misgender_rates,
    odds_ratio_per_step,
)
from voicebias.systems.reference import planted_p_female, planted_truth


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
    df = table(
        {
            ("masculine", "male"): (1, 4),
            ("feminine", "female"): (4, 1),
            ("neutral", "male"): (2, 3),
            ("neutral", "female"): (3, 2),
            ("masculine", "female"): (2, 3),
            ("feminine", "male"): (3, 2),
        }
    )
    df = pd.concat(
        [df, pd.DataFrame([{"lang": "en", "pole": "neutral", "voice_gender": "male", "judged_gender": "none"}] * 3)]
    )
    res = odds_ratio_per_step(df).iloc[0]
    assert res["n"] == 30 and res["n_excluded"] == 3


def test_complete_separation_is_reported_not_estimated():
    # a voice-faithful system with no errors: voice predicts the answer perfectly
    counts = {
        (p, v): ((10, 0) if v == "female" else (0, 10))
        for p in ("masculine", "neutral", "feminine")
        for v in ("male", "female")
    }
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
    df = table(
        {
            ("feminine", "male"): (3, 1),
            ("masculine", "female"): (0, 2),
            ("neutral", "male"): (1, 3),
            ("feminine", "female"): (5, 0),
            ("masculine", "male"): (1, 4),
        }
    )
    r = misgender_rates(df).set_index(["lang", "cell_type"])
    # misaligned: male voice+feminine content 3 of 4 called female, female voice+masculine 2 of 2 called male
    assert r.loc[("en", "misaligned"), "misgendered"] == 5 and r.loc[("en", "misaligned"), "n"] == 6
    assert r.loc[("en", "misaligned"), "rate"] == 5 / 6
    assert r.loc[("en", "aligned"), "rate"] == 1 / 10
    assert r.loc[("en", "neutral"), "rate"] == 1 / 4
    assert r.loc[("ALL", "misaligned"), "rate"] == 5 / 6


def test_fisher_matches_known_value():
    # fisher.test(matrix(c(3,1,1,3),2)) in R: p-value = 0.4857, odds ratio (sample) = 9
    rates = pd.DataFrame(
        [
            {"lang": "en", "cell_type": "misaligned", "n": 4, "misgendered": 3},
            {"lang": "en", "cell_type": "neutral", "n": 4, "misgendered": 1},
        ]
    )
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
                rows.append(
                    {
                        "lang": "en",
                        "pole": pole,
                        "voice_gender": v,
                        "judged_gender": "female" if rng.random() < p else "male",
                    }
                )
    return pd.DataFrame(rows)


def reference_params(**kw):
    """A complete reference-system parameter block (every key planted_truth reads)."""
    return {"error_rate": 0.0, "neutral_p_female": 0.5, "noncompliance_rate": 0.0, "drift_st": 0.0, **kw}


@pytest.mark.parametrize(
    "params",
    [
        reference_params(rule="content", error_rate=0.05),
        reference_params(rule="voice", error_rate=0.05),
        reference_params(rule="mixed", error_rate=0.05, content_weight=0.5),
    ],
)
def test_planted_odds_ratio_recovered(params):
    truth = planted_truth(params)
    res = odds_ratio_per_step(simulate(params, 400, seed=7)).iloc[0]
    assert res["ci_low"] <= truth["odds_ratio_per_step"] <= res["ci_high"]
    # with 2400 rows the estimate lands within 25% of the planted value on the OR scale
    assert res["odds_ratio"] == pytest.approx(truth["odds_ratio_per_step"], rel=0.25)


def test_planted_truth_closed_forms():
    assert planted_truth(reference_params(rule="content", error_rate=0.05))["odds_ratio_per_step"] == pytest.approx(
        19.0, rel=1e-6
    )
    assert planted_truth(reference_params(rule="voice", error_rate=0.1))["odds_ratio_per_step"] == pytest.approx(
        1.0, abs=1e-6
    )
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
    counts = {
        (p, v): ((10, 0) if v == "female" else (0, 10))
        for p in ("masculine", "neutral", "feminine")
        for v in ("male", "female")
    }
    res = odds_ratio_per_step(table(counts)).iloc[0]
    assert res["fit_status"].startswith("perfect separation")
    # content carries no information: the penalised estimate sits at OR 1 with a CI covering it
    assert res["firth_odds_ratio"] == pytest.approx(1.0, abs=1e-6)
    assert res["firth_ci_low"] < 1 < res["firth_ci_high"] and res["firth_p_value"] > 0.99


def content_separated(per_cell=12):
    return {
        (p, v): ((per_cell, 0) if p == "feminine" else (0, per_cell))
        for p in ("masculine", "neutral", "feminine")
        for v in ("male", "female")
    }


def test_the_content_separated_table_gives_a_separation_row_not_an_exception():
    # 12 answers per cell, 'female' exactly on feminine content: the table that stopped the describe analysis
    res = odds_ratio_per_step(table(content_separated(12))).iloc[0]
    assert (res["status"], res["fit_status"]) == ("separation", "perfect separation (complete)")
    assert "complete separation" in res["reason"] and "Firth" in res["reason"]
    assert 1 < res["firth_ci_low"] < res["firth_odds_ratio"] < res["firth_ci_high"] < np.inf


def test_a_level_the_profile_never_reaches_leaves_both_sides_open():
    # at confidence 1 the chi-square level is infinite: the profile crosses it nowhere, so both bounds are open
    from voicebias.analysis.stats import firth_coefficient

    X, y = two_by_two(0, 10, 7, 3)
    res = firth_coefficient(X, y, 1, confidence=1.0)
    assert np.isfinite(res["coef"]) and res["ci_low"] == -np.inf and res["ci_high"] == np.inf
    row = odds_ratio_per_step(table(content_separated(12)), confidence=1.0).iloc[0]
    assert row["status"] == "separation" and "open on the lower and upper side" in row["reason"]
    assert row["firth_ci_low"] == 0.0 and row["firth_ci_high"] == np.inf


def test_a_firth_fit_that_cannot_converge_is_not_estimable_not_a_runtime_error():
    from voicebias.analysis.stats import firth_fit
    from voicebias.analysis.status import NotEstimable

    X, y = two_by_two(12, 0, 0, 9)
    with pytest.raises(NotEstimable, match="did not converge in 1 steps"):
        firth_fit(X, y, max_iter=1)


def test_a_failed_firth_fit_leaves_a_row_that_says_so(monkeypatch):
    import voicebias.analysis.stats as S
    from voicebias.analysis.status import NotEstimable

    def fails(*args, **kwargs):
        raise NotEstimable("Firth fit did not converge in 500 steps (max |score| 0.001)")

    monkeypatch.setattr(S, "firth_coefficient", fails)
    sep = odds_ratio_per_step(table(content_separated(12))).iloc[0]
    assert sep["status"] == "not estimable" and "did not converge in 500 steps" in sep["reason"]
    assert np.isnan(sep["firth_odds_ratio"]) and np.isnan(sep["odds_ratio"])
    counts = {
        (p, v): (3 + i, 7 - i) for i, p in enumerate(("masculine", "neutral", "feminine")) for v in ("male", "female")
    }
    fine = odds_ratio_per_step(table(counts)).iloc[0]
    assert (
        fine["status"] == "ok" and np.isfinite(fine["odds_ratio"]) and "Firth estimate not estimable" in fine["reason"]
    )


@pytest.mark.parametrize(
    "case,rows,reason",
    [
        ("no answers", [], "no answers"),
        ("every answer 'none'", [("masculine", "male", "none"), ("feminine", "female", "none")], "no compliant answer"),
        (
            "one input voice",
            [(p, "male", j) for p in ("masculine", "feminine") for j in ("male", "female")],
            "only one input voice",
        ),
        (
            "one content pole",
            [("neutral", v, j) for v in ("male", "female") for j in ("male", "female")],
            "only one content pole",
        ),
    ],
)
def test_describe_without_an_estimable_model_says_why(case, rows, reason):
    df = pd.DataFrame(rows, columns=["pole", "voice_gender", "judged_gender"]).assign(lang="en")
    res = odds_ratio_per_step(df).iloc[0]
    assert res["status"] == "not estimable" and reason in res["reason"]
    assert np.isnan(res["odds_ratio"]) and np.isnan(res["firth_odds_ratio"])


def test_every_answer_one_gender_is_a_separation_with_a_firth_estimate():
    counts = {(p, v): (8, 0) for p in ("masculine", "neutral", "feminine") for v in ("male", "female")}
    res = odds_ratio_per_step(table(counts)).iloc[0]
    assert res["status"] == "separation" and "every compliant answer is 'female'" in res["reason"]
    # the answers carry no information about content: the penalised estimate is OR 1
    assert res["firth_odds_ratio"] == pytest.approx(1.0, abs=1e-9)


def test_fisher_rows_with_a_zero_cell_or_an_empty_cell_type_carry_a_status():
    rates = pd.DataFrame(
        [
            {"lang": "en", "cell_type": "misaligned", "n": 10, "misgendered": 10},
            {"lang": "en", "cell_type": "neutral", "n": 10, "misgendered": 0},
            {"lang": "zh", "cell_type": "misaligned", "n": 0, "misgendered": 0},
            {"lang": "zh", "cell_type": "neutral", "n": 5, "misgendered": 1},
            {"lang": "es", "cell_type": "misaligned", "n": 6, "misgendered": 0},
            {"lang": "es", "cell_type": "neutral", "n": 6, "misgendered": 0},
        ]
    )
    res = fisher_misaligned_vs_neutral(rates).set_index("lang")
    assert res.loc["en", "status"] == "separation" and "infinite" in res.loc["en", "reason"]
    assert res.loc["en", "p_value"] == pytest.approx(2 / 184756)  # two-sided: the two extreme tables of C(20, 10)
    assert res.loc["zh", "status"] == "not estimable" and "misaligned" in res.loc["zh", "reason"]
    assert res.loc["es", "status"] == "separation" and "no answer misgenders" in res.loc["es", "reason"]
    assert res.loc["es", "p_value"] == 1.0
