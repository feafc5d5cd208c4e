"""The judge beta regression (voicebias.analysis.sc.judge_models): planted coefficients recovered,
the fit equal to an independent maximum-likelihood fit, and only numerical failures recorded as rows.

The reference is the beta log-likelihood (logit mean, log precision) maximised directly with
scipy.optimize on a sum-to-zero design built here by hand; the product fits with statsmodels'
BetaModel through patsy, so the two share neither the design code nor the optimiser.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy import optimize, special, stats

from voicebias.analysis import sc_stats
from voicebias.analysis.sc import judge_models
from voicebias.analysis.sc_stats import beta_regression_stepwise
from voicebias.analysis.status import NotEstimable

LEVELS = {
    "phonation": ["breathy", "creaky", "endcreak", "modal"],
    "system": ["sysA", "sysB"],
    "voice_gender": ["female", "male"],
}
VOICES = {"f1": "female", "f2": "female", "m1": "male", "m2": "male"}
#: planted sum-to-zero coefficients on the logit of the mean (the last level of each factor is minus the sum)
PLANTED = {
    "Intercept": 0.2,
    "C(phonation, Sum)[S.breathy]": 0.3,
    "C(phonation, Sum)[S.creaky]": -0.4,
    "C(phonation, Sum)[S.endcreak]": 0.1,
    "C(system, Sum)[S.sysA]": -0.15,
    "C(voice_gender, Sum)[S.female]": 0.25,
}
PRECISION = 25.0


def sum_columns(df: pd.DataFrame, term: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Sum-to-zero columns of a term (factors in sorted order), named as patsy names them."""
    cols = {}
    for combo in itertools.product(*[LEVELS[f][:-1] for f in term]):
        name = ":".join(f"C({f}, Sum)[S.{lv}]" for f, lv in zip(term, combo))
        value = np.ones(len(df))
        for f, lv in zip(term, combo):
            value = value * ((df[f] == lv).to_numpy(float) - (df[f] == LEVELS[f][-1]).to_numpy(float))
        cols[name] = value
    return cols


def design(df: pd.DataFrame, terms: list[tuple[str, ...]]) -> pd.DataFrame:
    out = {"Intercept": np.ones(len(df))}
    for t in terms:
        out.update(sum_columns(df, t))
    return pd.DataFrame(out, index=df.index)


def planted_table(prompts: int = 40, seed: int = 3) -> pd.DataFrame:
    """One judged continuation per prompt x voice x phonation x system, y ~ Beta(mu phi, (1 - mu) phi)
    with logit mu = the planted main effects (no interaction) and phi = PRECISION."""
    rng = np.random.default_rng(seed)
    rows = [
        {"prompt_id": f"p{p:02d}", "voice_id": v, "voice_gender": g, "phonation": ph, "system": s, "judge_status": "ok"}
        for p in range(prompts)
        for v, g in VOICES.items()
        for ph in LEVELS["phonation"]
        for s in LEVELS["system"]
    ]
    df = pd.DataFrame(rows)
    X = design(df, [("phonation",), ("system",), ("voice_gender",)])
    mu = special.expit(X[list(PLANTED)].to_numpy() @ np.array(list(PLANTED.values())))
    return df.assign(y=rng.beta(mu * PRECISION, (1 - mu) * PRECISION))


def ml_fit(y: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Maximum-likelihood (beta, log phi) of the beta regression, by BFGS with the analytic gradient."""
    ly, l1y = np.log(y), np.log1p(-y)

    def nll(theta: np.ndarray) -> tuple[float, np.ndarray]:
        b, phi = theta[:-1], np.exp(theta[-1])
        mu = special.expit(X @ b)
        a, c = mu * phi, (1 - mu) * phi
        ll = special.gammaln(phi) - special.gammaln(a) - special.gammaln(c) + (a - 1) * ly + (c - 1) * l1y
        # d ll / d mu and / d phi
        dmu = phi * (ly - l1y - special.digamma(a) + special.digamma(c))
        dphi = special.digamma(phi) - mu * special.digamma(a) - (1 - mu) * special.digamma(c) + mu * ly + (1 - mu) * l1y
        grad_b = X.T @ (dmu * mu * (1 - mu))
        return -float(ll.sum()), -np.append(grad_b, float(dphi.sum()) * phi)

    start = np.append(np.linalg.lstsq(X, special.logit(y), rcond=None)[0], np.log(10.0))
    res = optimize.minimize(nll, start, jac=True, method="BFGS", options={"gtol": 1e-10, "maxiter": 5000})
    # BFGS may stop at rounding ("precision loss") before gtol: the point is the optimum when the
    # gradient is small next to the curvature: with SEs about 0.01 (curvature 1/SE^2 = 1e4), a
    # gradient below 1e-4 puts b within 1e-8 of the optimum
    assert res.success or np.max(np.abs(res.jac)) < 1e-4, res.message
    return res.x


def test_planted_coefficients_are_recovered_and_equal_an_independent_ml_fit():
    df = planted_table()
    res = beta_regression_stepwise(
        df, "y", ["phonation", "voice_gender", "system"], cluster="prompt_id", between_unit_factors=("voice_gender",)
    )
    coefs = res["coefficients"].set_index("term")
    kept = [tuple(t.split(":")) for t in res["kept_interactions"]["term"]]
    # the terms with voice_gender stay in the model untested; phonation:system (planted 0) is testable
    assert {("phonation", "voice_gender"), ("system", "voice_gender"), ("phonation", "system", "voice_gender")} <= set(
        kept
    )
    X = design(df, [("phonation",), ("system",), ("voice_gender",), *kept])
    assert set(coefs.index) == {*X.columns, "precision"}
    # planted values inside the 99.9 % CIs (t with prompts - 1 df, the cluster-robust SEs); interactions planted 0
    half = stats.t.isf(0.0005, df["prompt_id"].nunique() - 1) * coefs["se"]
    planted = pd.Series({name: PLANTED.get(name, 0.0) for name in X.columns} | {"precision": np.log(PRECISION)})
    assert (np.abs(coefs["estimate"] - planted[coefs.index]) <= half).all(), pd.DataFrame(
        {"estimate": coefs["estimate"], "planted": planted, "half": half}
    )
    # and the main effects within 0.06 on the logit scale (their SEs are about 0.01)
    for name, value in PLANTED.items():
        assert coefs.loc[name, "estimate"] == pytest.approx(value, abs=0.06)
    # the fit is the maximum of the beta likelihood: the independent optimisation reaches the same point
    ref = pd.Series(ml_fit(df["y"].to_numpy(), X.to_numpy()), index=[*X.columns, "precision"])
    assert np.max(np.abs(coefs["estimate"] - ref[coefs.index])) < 5e-5  # SEs about 0.01; measured 5e-6
    assert float(res["llf"]["llf"].iloc[0]) > 0


def test_judge_models_fits_the_judge_scores_with_the_same_model():
    """judge_models rescales a dimension's scores to (0, 1) and fits the same stepwise model, clustered
    by prompt, with voice_gender between units: scores mapped back from the planted y give its fit."""
    df = planted_table(prompts=12, seed=8)
    n = len(df)
    scores = df.assign(agency_competence=1 + 4 * (df["y"] * n - 0.5) / (n - 1))  # rescale_scores inverted
    jm = judge_models(scores, ["agency_competence"])
    direct = beta_regression_stepwise(
        df, "y", ["phonation", "voice_gender", "system"], cluster="prompt_id", between_unit_factors=("voice_gender",)
    )
    assert list(jm["fits"]["status"]) == ["ok"] and jm["fits"]["reason"].iloc[0] == ""
    ours = jm["coefficients"].set_index("term")["estimate"]
    theirs = direct["coefficients"].set_index("term")["estimate"]
    assert list(ours.index) == list(theirs.index)
    assert np.max(np.abs(ours - theirs)) < 1e-6
    assert (jm["coefficients"]["status"] == "ok").all()


def raising(exc: Exception):
    def fit(*args, **kwargs):
        raise exc

    return fit


@pytest.mark.parametrize(
    "exc", [NotEstimable("the beta regression 'y ~ 1' did not converge"), np.linalg.LinAlgError("Singular matrix")]
)
def test_a_numerical_failure_becomes_a_row_and_the_other_dimensions_still_run(monkeypatch, exc):
    df = planted_table(prompts=4, seed=1)
    scores = df.assign(a=np.round(1 + 4 * df["y"]), b=np.round(1 + 4 * df["y"][::-1].to_numpy()))
    real = sc_stats._fit_beta
    calls = {"n": 0}

    def first_fails(formula, data, cluster=None):
        calls["n"] += 1
        if calls["n"] == 1:  # the first fit of dimension a
            raise exc
        return real(formula, data, cluster)

    monkeypatch.setattr(sc_stats, "_fit_beta", first_fails)
    fits = judge_models(scores, ["a", "b"])["fits"].set_index("dimension")
    assert fits.loc["a", "status"] == "not estimable" and str(exc) in fits.loc["a", "reason"]
    assert fits.loc["b", "status"] == "ok"


@pytest.mark.parametrize(
    "exc",
    [
        TypeError("fit() got an unexpected keyword argument 'cov_type'"),
        KeyError("prompt_id"),
        AttributeError("'NoneType' object has no attribute 'params'"),
    ],
)
def test_a_wiring_error_in_the_regression_propagates(monkeypatch, exc):
    """A fault of the code or the inputs is not a property of the data: it fails the stage."""
    monkeypatch.setattr(sc_stats, "_fit_beta", raising(exc))
    df = planted_table(prompts=4, seed=1).assign(a=lambda x: np.round(1 + 4 * x["y"]))
    with pytest.raises(type(exc)):
        judge_models(df, ["a"])


def test_a_missing_column_raises_rather_than_becoming_a_failed_row():
    df = planted_table(prompts=4, seed=1).assign(a=lambda x: np.round(1 + 4 * x["y"])).drop(columns=["system"])
    with pytest.raises(KeyError, match="system"):
        judge_models(df, ["a"])


def test_the_sc_analysis_fails_on_a_wiring_error_in_the_judge_regression(monkeypatch):
    from tests.support.sc_tables import _planted_tables
    from voicebias.analysis.sc import analyse

    pm, sc = _planted_tables({"male": 0.8, "female": 0.2}, prompts=3)
    monkeypatch.setattr(sc_stats, "_fit_beta", raising(TypeError("a changed statsmodels signature")))
    with pytest.raises(TypeError, match="changed statsmodels signature"):
        analyse(sc, pm, n_boot=10)


def test_degenerate_judge_tables_give_reasons():
    df = planted_table(prompts=4, seed=1)
    one_prompt = df[df["prompt_id"] == "p00"].assign(a=lambda x: np.round(1 + 4 * x["y"]))
    constant = df.assign(a=3.0)
    for table, reason in ((one_prompt, "at least 2 clusters"), (constant, "constant scores")):
        fits = judge_models(table, ["a"])["fits"]
        assert fits["status"].iloc[0] == "not estimable" and reason in fits["reason"].iloc[0]
    # an empty cell of the factorial: one system never continues a breathy prompt
    empty_cell = df[~((df["system"] == "sysB") & (df["phonation"] == "breathy"))].assign(
        a=lambda x: np.round(1 + 4 * x["y"])
    )
    fits = judge_models(empty_cell, ["a"])["fits"]
    assert fits["status"].iloc[0] == "not estimable" and "rank deficient" in fits["reason"].iloc[0]


@pytest.mark.parametrize("rounding", [0.0, 1e-12])
def test_a_term_the_scores_do_not_vary_along_is_not_tested(rounding):
    """Each prompt x voice gets one score whatever the phonation and system (what a judge that
    ignores the audio gives): those terms' estimates and SEs are rounding (1e-16), and a p-value
    of rounding over rounding is anything (0.98 on one processor, 1e-8 on another). They are
    reported not testable with an empty p, their interaction too; the voice effect is estimated
    as usual. Values equal up to 1e-12 give the same table."""
    df = planted_table(prompts=12, seed=5)
    first = df.groupby(["prompt_id", "voice_id"])["y"].transform("first")
    df = df.assign(y=first * (1 + rounding * np.random.default_rng(2).standard_normal(len(df))))
    res = beta_regression_stepwise(
        df, "y", ["phonation", "voice_gender", "system"], cluster="prompt_id", between_unit_factors=("voice_gender",)
    )
    coefs = res["coefficients"].set_index("term")
    flat = [t for t in coefs.index if t.startswith(("C(phonation", "C(system")) and "voice_gender" not in t]
    assert flat and not coefs.loc[flat, "testable"].any() and coefs.loc[flat, "p_value"].isna().all()
    assert coefs.loc[flat, "note"].str.contains("do not vary along this term").all()
    assert (coefs.loc[flat, "se"].abs() < 1e-7).all()
    gender = "C(voice_gender, Sum)[S.female]"
    assert coefs.loc[gender, "se"] > 1e-3  # the voices differ: a real estimate (untested: between voices)
    assert any(":" in t for t in flat)  # the phonation x system interaction too


def test_an_interaction_the_scores_do_not_vary_along_is_removed_untested():
    df = planted_table(prompts=12, seed=6)
    df = df.assign(y=df.groupby(["prompt_id", "voice_id"])["y"].transform("first"))
    res = beta_regression_stepwise(df, "y", ["phonation", "system"], cluster="prompt_id")
    steps = res["steps"].set_index("removed")
    assert list(steps.index) == ["phonation:system"] and np.isnan(steps.loc["phonation:system", "p_value"])
    assert res["kept_interactions"].empty
