"""RQ1 estimands on synthetic delta tables with planted drift."""

import numpy as np
import pandas as pd
import pytest

from tests.support.stats import deltas
from voicebias.analysis.rq1 import cohens_d, rq1_contrasts, rq1_mixed_models, rq1_pooled


def test_cohens_d_closed_form():
    a, b = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.0, 1.0, 2.0, 3.0])
    assert cohens_d(a, b) == pytest.approx(1.0 / np.sqrt(np.var(a, ddof=1)))


def test_contrast_and_welch_test_by_hand():
    d = deltas(drift=0.0, seed=1)
    res = rq1_contrasts(d).set_index(["lang", "task", "voice_gender"])
    row = res.loc[("en", "readback", "male")]
    g = d[(d["lang"] == "en") & (d["task"] == "readback") & (d["voice_gender"] == "male")]
    mis = g.loc[g["pole"] == "feminine", "delta_composite"].to_numpy()
    neu = g.loc[g["pole"] == "neutral", "delta_composite"].to_numpy()
    se = np.sqrt(mis.var(ddof=1) / len(mis) + neu.var(ddof=1) / len(neu))
    assert row["contrast"] == pytest.approx(mis.mean() - neu.mean())
    assert row["t"] == pytest.approx((mis.mean() - neu.mean()) / se)
    # female voice: misaligned is masculine content, predicted sign is negative
    f = res.loc[("en", "readback", "female")]
    assert f["signed_contrast"] == pytest.approx(-f["contrast"])


def test_pooled_contrast_recovers_a_planted_drift_with_the_right_sign():
    drifting = rq1_pooled(deltas(drift=0.3, seed=2)).set_index("task_group")
    fixed = rq1_pooled(deltas(drift=0.0, seed=3)).set_index("task_group")
    same = drifting.loc["same-language"]
    assert same["ci_low"] <= 0.3 <= same["ci_high"] and same["p_value"] < 1e-6
    assert fixed.loc["same-language", "ci_low"] <= 0 <= fixed.loc["same-language", "ci_high"]
    assert set(drifting.index) == {"same-language", "cross-lingual"}  # translate reported separately


def test_mixed_model_interaction_detects_planted_interaction_only():
    null = rq1_mixed_models(deltas(seed=4))
    planted = rq1_mixed_models(deltas(interaction=1.0, seed=4))
    assert (null["p_interaction"] > 0.001).all()
    assert (planted["p_interaction"] < 1e-4).all()
    assert planted["converged"].all() and set(planted["df"]) == {2}


def test_drift_shift_is_deterministic_and_moves_f0_by_the_planted_semitones():
    """The drifting system's PSOLA shift gives the same samples every call (so a rerun on
    another machine reproduces its outputs) and moves median F0 by the planted amount."""
    import hashlib

    from voicebias.instruments.acoustics import MeasureSettings, measure_signal
    from voicebias.systems.reference import shift_pitch
    from voicebias.tts.espeak import EspeakTTS

    x, sr = EspeakTTS(rate_wpm=160).synthesize(
        "I spent the morning fixing the old fence behind the garden.", "en-us+f2"
    )
    a, b = shift_pitch(x, sr, 2.0), shift_pitch(x, sr, 2.0)
    assert len(a) == len(x) and hashlib.sha256(a.tobytes()).digest() == hashlib.sha256(b.tobytes()).digest()
    ms = MeasureSettings(100, 500, 5500)
    base = measure_signal(x, sr, ms)["f0_median_st"]
    for st in (-2.0, 2.0):
        assert measure_signal(shift_pitch(x, sr, st), sr, ms)["f0_median_st"] - base == pytest.approx(st, abs=0.15)


def test_panel_pooled_contrast_is_the_mean_over_systems_cells():
    a = deltas(drift=0.3, seed=30).assign(system="a")
    b = deltas(drift=0.0, seed=31).assign(system="b")
    each = rq1_pooled(pd.concat([a, b])).set_index(["system", "task_group"])
    panel = rq1_pooled(pd.concat([a, b]), pool_systems=True).set_index(["system", "task_group"])
    # both systems answer the same stimuli: the panel is one system whose delta is the mean of the two
    mean = a.assign(delta_composite=(a["delta_composite"].to_numpy() + b["delta_composite"].to_numpy()) / 2)
    averaged = rq1_pooled(mean).set_index("task_group")
    for group in ("same-language", "cross-lingual"):
        ra, rb, rp = each.loc[("a", group)], each.loc[("b", group)], panel.loc[("ALL", group)]
        assert rp["n_cells"] == ra["n_cells"] == rb["n_cells"] and rp["n_systems"] == 2
        assert rp["pooled_contrast"] == pytest.approx((ra["pooled_contrast"] + rb["pooled_contrast"]) / 2, rel=1e-12)
        for col in ("se", "df", "ci_low", "ci_high", "p_value"):
            assert rp[col] == pytest.approx(averaged.loc[group, col], rel=1e-10)


def test_constant_measure_gives_zero_effects_with_zero_width_intervals():
    """Every output equal to its text control (net 0 everywhere): the effects are exactly 0
    with no sampling variance, and no test is claimed."""
    d = deltas(seed=5).assign(delta_composite=0.0)
    m = rq1_mixed_models(d)
    for eff in ("stereotype_effect", "misaligned_minus_neutral"):
        assert (m[f"{eff}_est"] == 0).all() and (m[f"{eff}_ci_low"] == 0).all() and (m[f"{eff}_ci_high"] == 0).all()
        assert m[f"{eff}_p"].isna().all()
    assert m["p_interaction"].isna().all() and m["warning"].str.startswith("no variance").all()


def test_identical_outputs_within_passages_use_the_passage_means():
    """A fixed output voice reads the same words for both input voices, so both outputs of a
    passage are equal: the stereotype effect is then (mean feminine - mean masculine
    passage) / 2 with the pooled between-passage variance on n_passages - 3 df (the one-way
    ANOVA of the passage values on pole, computed here by hand)."""
    from scipy import stats

    rng = np.random.default_rng(7)
    rows = []
    for pole, mu in (("masculine", -2.0), ("neutral", 0.0), ("feminine", 2.0)):
        for i in range(10):
            y = mu + rng.normal(0, 0.3)
            for voice in ("male", "female"):
                rows.append(
                    {
                        "system": "s",
                        "lang": "en",
                        "task": "readback",
                        "pole": pole,
                        "voice_gender": voice,
                        "passage_id": f"{pole}-{i}",
                        "stimulus_id": f"{pole}-{i}-{voice}",
                        "status": "ok",
                        "delta_composite": y,
                    }
                )
    d = pd.DataFrame(rows)
    r = rq1_mixed_models(d).iloc[0]
    per = d.drop_duplicates("passage_id")
    means = per.groupby("pole")["delta_composite"].mean()
    resid = per["delta_composite"] - per["pole"].map(means)
    s2 = float((resid**2).sum() / (len(per) - 3))
    est = (means["feminine"] - means["masculine"]) / 2
    se = np.sqrt(s2 * (1 / 10 + 1 / 10)) / 2
    assert r["stereotype_effect_est"] == pytest.approx(est, abs=1e-6)
    assert r["stereotype_effect_se"] == pytest.approx(se, rel=1e-4)
    assert r["stereotype_effect_df"] == 27
    half = stats.t.ppf(0.975, 27) * r["stereotype_effect_se"]
    assert r["stereotype_effect_ci_low"] == pytest.approx(r["stereotype_effect_est"] - half, abs=1e-12)
    assert r["converged"] and "residual variance 0" in r["warning"] and np.isnan(r["p_interaction"])


def pole_function_table(rounding: float = 0.0, seed: int = 3) -> pd.DataFrame:
    """Every output's measure is a function of its content pole alone (the same value for both voices
    and every passage of a pole: what a system that ignores its input gives), optionally with relative
    noise of size `rounding` as another BLAS kernel's last bits would add."""
    rng = np.random.default_rng(seed)
    rows = []
    for pole, mu in (("masculine", 0.00893), ("neutral", 0.0), ("feminine", 0.384337)):
        for i in range(3):
            for voice in ("male", "female"):
                rows.append(
                    {
                        "system": "s",
                        "lang": "zh",
                        "task": "summarize",
                        "pole": pole,
                        "voice_gender": voice,
                        "passage_id": f"{pole}-{i}",
                        "stimulus_id": f"{pole}-{i}-{voice}",
                        "status": "ok",
                        "delta_composite": mu * (1 + rounding * rng.standard_normal()),
                    }
                )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("rounding", [0.0, 1e-15, 1e-9])
def test_a_measure_that_is_a_function_of_the_pole_is_an_exact_fit_not_a_crash(rounding):
    """No residual variance within or between passages: the effects are the pole means' contrasts,
    known exactly (SE 0, zero-width interval, no p), and the row says so; the last bits of the
    values (exactly equal, or equal up to 1e-15 or 1e-9 of their size) do not change the category."""
    r = rq1_mixed_models(pole_function_table(rounding)).iloc[0]
    # per content step (mu_feminine - mu_masculine) / 2; signed misaligned - neutral, averaged over
    # the voices: ((mu_feminine - 0) - (mu_masculine - 0)) / 2, the same number here
    assert r["stereotype_effect_est"] == pytest.approx((0.384337 - 0.00893) / 2, rel=1e-6)
    assert r["misaligned_minus_neutral_est"] == pytest.approx((0.384337 - 0.00893) / 2, rel=1e-6)
    for eff in ("stereotype_effect", "misaligned_minus_neutral"):
        assert r[f"{eff}_se"] == 0 and np.isnan(r[f"{eff}_p"])
        assert r[f"{eff}_ci_low"] == r[f"{eff}_ci_high"] == r[f"{eff}_est"]
    assert r["status"] == "not estimable" and "exact fit" in r["reason"]


@pytest.mark.parametrize("rounding", [0.0, 1e-15, 1e-9])
def test_a_measure_constant_up_to_rounding_is_constant(rounding):
    d = deltas(seed=5).assign(delta_composite=0.25)
    d["delta_composite"] *= 1 + rounding * np.random.default_rng(1).standard_normal(len(d))
    m = rq1_mixed_models(d)
    assert m["warning"].str.startswith("no variance").all() and (m["status"] == "not estimable").all()
    c = rq1_contrasts(d)
    assert (c["reason"] == "no variance: the measure is constant in both cells").all()


def test_a_reml_search_stopped_short_on_a_flat_deviance_is_converged_once_polished():
    """A passage variance about a thousand times the residual one (a fixed output voice: the outputs of
    a passage nearly equal) leaves the REML deviance so flat that the bounded search stops short of
    the optimum (its slope in log variance ratio above the 1e-3 margin there); Newton's steps from
    there reach it. The fit is converged, and its variances and effects are lme4's."""
    from scipy import optimize

    from tests.support.rref import run_r
    from voicebias.analysis import mixed

    rng = np.random.default_rng(1)
    passage = np.repeat(np.arange(30), 2)
    pole = passage % 3
    X = np.column_stack([np.ones(60), np.tile([0.0, 1.0], 30), pole == 1, pole == 2]).astype(float)
    y = X @ np.array([0.5, 0.2, 0.1, -0.3]) + rng.normal(0, 0.13, 30)[passage] + rng.normal(0, 0.0039, 60)
    D = mixed._Design(y, X, [passage])
    located = min(
        (
            optimize.minimize(
                mixed._reml_objective,
                np.full(1, start),
                args=(D,),
                method="L-BFGS-B",
                bounds=[(0.0, None)],
                options={"maxiter": 1000, "ftol": 1e-14, "gtol": 1e-10},
            )
            for start in (0.1, 1.0, 5.0)
        ),
        key=lambda r: r.fun,
    )
    assert not mixed._at_optimum(located.x, D, bounded=True)  # the search stopped short
    fit = mixed.fit_reml_matrices(y, X, ["Intercept", "b", "p1", "p2"], {"passage": passage}, nobound=False)
    assert fit.converged and 300 < fit.vcomp["passage"] / fit.vcomp["residual"] < 3000
    table = pd.DataFrame({"y": y, "b": X[:, 1], "p1": X[:, 2], "p2": X[:, 3], "passage": passage})
    ref = run_r(
        "suppressMessages(library(lme4))\n"
        "m <- lmer(y ~ b + p1 + p2 + (1 | passage), table, REML = TRUE, "
        "control = lmerControl(optimizer = 'bobyqa', optCtrl = list(rhobeg = 1e-3, rhoend = 1e-12)))\n"
        "vc <- as.data.frame(VarCorr(m)); emit('vc', vc$vcov); emit('b', fixef(m)); "
        "emit('se', sqrt(diag(as.matrix(vcov(m)))))",
        table=table,
    )
    assert fit.vcomp.to_numpy() == pytest.approx(ref["vc"], rel=1e-6)
    assert fit.params.to_numpy() == pytest.approx(ref["b"], rel=1e-8, abs=1e-12)
    assert fit.bse.to_numpy() == pytest.approx(ref["se"], rel=1e-6)
