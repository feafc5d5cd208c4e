"""SC statistics against closed forms, an independent implementation and planted effects."""

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
from scipy import stats

from voicebias.sc_stats import (all_systems_succeeded, beta_regression_stepwise, emm_pairwise, rescale_scores,
                                type3_wald, voice_quality_models)


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
    # planted: continuations pull H1-H2 back toward modal, more for female prompts
    rng = np.random.default_rng(2)
    rows = []
    for sid in range(120):
        gender = "female" if sid % 2 else "male"
        phon = ["modal", "breathy"][sid // 2 % 2]
        u = rng.normal(0, 0.5)
        prompt = (4.0 if phon == "breathy" else 0.0) + u
        pull = (3.0 if gender == "female" else 1.0) if phon == "breathy" else 0.0
        rows.append({"stimulus_id": f"s{sid}", "voice_gender": gender, "phonation": phon, "source": "prompt",
                     "h1h2_db": prompt + rng.normal(0, 0.5)})
        rows.append({"stimulus_id": f"s{sid}", "voice_gender": gender, "phonation": phon, "source": "continuation",
                     "h1h2_db": prompt - pull + rng.normal(0, 0.5)})
    res = voice_quality_models(pd.DataFrame(rows), measures=["h1h2_db"], factors=["source", "voice_gender", "phonation"])
    t3 = res["type3"].set_index("term")
    assert t3.loc["C(source, Sum):C(voice_gender, Sum):C(phonation, Sum)", "p_value"] < 1e-6
    c = res["contrasts"].set_index(["voice_gender", "phonation"])
    # continuation minus prompt: about -3 dB for breathy female, -1 dB for breathy male, 0 for modal
    est = lambda g, p: c.loc[(g, p), "estimate"] * (1 if c.loc[(g, p), "level_a"] == "continuation" else -1)
    assert est("female", "breathy") == pytest.approx(-3.0, abs=0.35)
    assert est("male", "breathy") == pytest.approx(-1.0, abs=0.35)
    assert abs(est("female", "modal")) < 0.35


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
    df = pd.DataFrame({"stimulus_id": ["a", "a", "b", "b"], "system": ["s1", "s2", "s1", "s2"],
                       "status": ["ok", "ok", "ok", "failed"]})
    assert set(all_systems_succeeded(df)["stimulus_id"]) == {"a"}
