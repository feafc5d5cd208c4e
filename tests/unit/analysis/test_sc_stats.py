"""SC statistics against closed forms, an independent implementation and planted effects."""

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
from scipy import stats

from tests.support.sc_design import planted_contrast, simulate_vq
from voicebias.analysis.emm import emm_pairwise, type3_wald
from voicebias.analysis.sc_stats import (
    all_systems_succeeded,
    beta_regression_stepwise,
    rescale_scores,
    voice_quality_models,
)


def balanced_two_way(seed=0, n=6, effect_a=(0.0, 0.8, -0.8), effect_b=0.5, inter=0.0):
    rng = np.random.default_rng(seed)
    rows = []
    for i, a in enumerate(["a1", "a2", "a3"]):
        for j, b in enumerate(["b1", "b2"]):
            mu = effect_a[i] + (effect_b if j else 0) + (inter if (i == 2 and j == 1) else 0)
            rows += [{"a": a, "b": b, "y": mu + rng.normal()} for _ in range(n)]
    return pd.DataFrame(rows)


def test_type3_wald_matches_closed_form_anova_on_balanced_data():
    d = balanced_two_way()
    fit = smf.ols("y ~ C(a, Sum) * C(b, Sum)", d).fit()
    res = type3_wald(fit).set_index("term")
    # closed form: balanced SS_A = n_per_level * sum (mean_a - grand)^2; Wald chi2 = SS_A / MSE
    grand = d["y"].mean()
    ss_a = sum(len(g) * (g["y"].mean() - grand) ** 2 for _, g in d.groupby("a"))
    assert res.loc["C(a, Sum)", "chi2"] == pytest.approx(ss_a / fit.mse_resid, rel=1e-9)
    assert res.loc["C(a, Sum)", "df"] == 2 and res.loc["C(a, Sum):C(b, Sum)", "df"] == 2


def test_tukey_contrasts_match_scipy_tukey_hsd_in_a_one_way_design():
    rng = np.random.default_rng(4)
    d = pd.DataFrame({"g": np.repeat(["x", "y", "z", "w"], 8)})
    d["y"] = rng.normal(size=len(d)) + d["g"].map({"x": 0, "y": 0.5, "z": 1.2, "w": 0.1})
    fit = smf.ols("y ~ C(g, Sum)", d).fit()
    ours = emm_pairwise(fit, d, "g", df_resid=fit.df_resid)
    ref = stats.tukey_hsd(*[d.loc[d["g"] == lv, "y"].to_numpy() for lv in sorted(d["g"].unique())])
    levels = sorted(d["g"].unique())
    for r in ours.itertuples():
        i, j = levels.index(r.level_a), levels.index(r.level_b)
        assert r.estimate == pytest.approx(ref.statistic[i, j], abs=1e-9)
        assert r.p_tukey == pytest.approx(ref.pvalue[i, j], abs=1e-4)


def test_mixed_model_finds_planted_source_by_phonation_regularisation():
    # planted: continuations keep 30 % (female) / 70 % (male) of each condition's shift
    keep = {"female": 0.3, "male": 0.7}
    vq = simulate_vq(1, prompts=30, seed=2, retention=keep)
    assert vq.groupby("source")["stimulus_id"].nunique().to_dict() == {"continuation": 480, "prompt": 480}
    assert (vq["source"] == "prompt").sum() == 480  # each prompt once
    res = voice_quality_models(vq, measures=["h1_h2_db"])
    t3 = res["type3"].set_index(["model", "term"])
    assert t3.loc[("continuation - prompt", "source:voice_gender:phonation"), "p_value"] < 1e-4
    c = res["contrasts"].set_index(["voice_gender", "phonation"])
    assert set(c["level_a"]) == {"sys1"} and set(c["level_b"]) == {"prompt"}
    for g, ph in [("female", "breathy"), ("male", "breathy"), ("female", "creaky"), ("male", "modal")]:
        assert c.loc[(g, ph), "estimate"] == pytest.approx(planted_contrast(g, ph, keep), abs=0.3)
        assert c.loc[(g, ph), "ci_low"] < c.loc[(g, ph), "estimate"] < c.loc[(g, ph), "ci_high"]


def test_degrees_of_freedom_are_those_of_four_voices():
    """960 continuations, but the gender comparisons rest on 2 voices per gender: the
    denominator df of every term are voice-level (at most 4 x 4 cells - 8 = 24), and the
    between-voice source x gender term is not tested."""
    vq = simulate_vq(2, prompts=30, seed=8, voice_shift_sd=0.4)
    t3 = voice_quality_models(vq, measures=["h1_h2_db"])["type3"].set_index(["model", "term"])
    assert (t3["den_df"] <= 24.5).all()
    row = t3.loc[("continuation - prompt", "source:voice_gender")]
    assert not row["testable"] and np.isnan(row["p_value"]) and row["note"].startswith("not testable")


def test_voice_stratum_f_equals_the_split_plot_anova_even_with_negative_components():
    """Balanced voice x system x condition cells: the system F of the REML model equals
    the classical split-plot F, MS(system) / MS(voice x system within gender), df (2, 4),
    also when a variance component is estimated below 0 (lme4's bounded fit would pool)."""
    import itertools

    from voicebias.analysis.mixed import fit_reml, type3_f_tests

    voices = {"f1": "female", "f2": "female", "m1": "male", "m2": "male"}
    rows = [
        {"voice_id": v, "voice_gender": g, "phonation": p, "system": s}
        for (v, g), p, s in itertools.product(voices.items(), ["a", "b", "c", "d"], ["s1", "s2", "s3"])
    ]
    d = pd.DataFrame(rows).assign(d=np.random.default_rng(11).normal(size=48))
    fit = fit_reml(
        "d ~ C(system, Sum) * C(voice_gender, Sum) * C(phonation, Sum)",
        d,
        {
            "voice": d["voice_id"],
            "voice:phonation": d["voice_id"] + ":" + d["phonation"],
            "voice:system": d["voice_id"] + ":" + d["system"],
        },
    )
    assert (fit.vcomp < 0).any()
    y = d.groupby(["voice_id", "system"])["d"].mean().unstack()
    gender = np.array([voices[v] for v in y.index])
    ss_err = 0.0
    for g in ("female", "male"):
        m = y[gender == g].to_numpy()
        ss_err += 4 * ((m - m.mean(axis=1, keepdims=True) - m.mean(axis=0, keepdims=True) + m.mean()) ** 2).sum()
    ss_sys = 16 * ((y.mean(axis=0) - y.to_numpy().mean()) ** 2).sum()
    row = type3_f_tests(fit, min_df=0).set_index("term").loc["system"]
    assert row["f_value"] == pytest.approx((ss_sys / 2) / (ss_err / 4), rel=1e-6)
    assert row["den_df"] == pytest.approx(4.0, rel=1e-4)
    assert row["p_value"] == pytest.approx(stats.f.sf((ss_sys / 2) / (ss_err / 4), 2, 4), rel=1e-5)


def simulate_beta(n=3000, inter=0.0, seed=5):
    rng = np.random.default_rng(seed)
    a = rng.choice(["f", "m"], n)
    b = rng.choice(["modal", "creaky"], n)
    eta = 0.3 + 0.4 * (a == "f") - 0.5 * (b == "creaky") + inter * ((a == "f") & (b == "creaky"))
    mu = 1 / (1 + np.exp(-eta))
    phi = 20.0
    y = rng.beta(mu * phi, (1 - mu) * phi)
    return pd.DataFrame({"gender": a, "phonation": b, "y": y})


def test_beta_regression_keeps_a_planted_interaction_and_drops_a_null_one():
    kept = beta_regression_stepwise(simulate_beta(inter=0.6), "y", ["gender", "phonation"])
    assert list(kept["kept_interactions"]["term"]) == ["gender:phonation"]
    dropped = beta_regression_stepwise(simulate_beta(inter=0.0), "y", ["gender", "phonation"])
    assert list(dropped["steps"]["removed"]) == ["gender:phonation"]
    coefs = dropped["coefficients"].set_index("term")["estimate"]
    # sum-to-zero coding: half the planted difference on the logit scale
    assert coefs.filter(like="C(gender, Sum)").iloc[0] == pytest.approx(0.2, abs=0.04)
    assert coefs.filter(like="C(phonation, Sum)").iloc[0] == pytest.approx(-0.25, abs=0.04)
    assert np.exp(coefs["precision"]) == pytest.approx(20.0, rel=0.1)


def test_rescaled_scores_stay_inside_the_unit_interval():
    s = rescale_scores(pd.Series([1, 2, 3, 4, 5] * 4, dtype=float))
    assert s.min() > 0 and s.max() < 1 and s.iloc[2] == pytest.approx(0.5)


def test_all_systems_succeeded_filter():
    df = pd.DataFrame(
        {
            "stimulus_id": ["a", "a", "b", "b"],
            "system": ["s1", "s2", "s1", "s2"],
            "status": ["ok", "ok", "ok", "failed"],
        }
    )
    assert set(all_systems_succeeded(df)["stimulus_id"]) == {"a"}
