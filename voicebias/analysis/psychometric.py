"""Psychometric functions of stated gender along a male-to-female voice continuum.

Each answer is a row: the continuum step its input voice sat on, the content pole of its
passage, the passage, the base voice the continuum was made from, and whether the system
called the speaker female (describe) or said "she" (summarize). The model is

    logit P(female) = b0 + b_x x + b_pole + passage + base voice,

with x the step's F0 in semitones above the male endpoint (steps are equal in semitones and
in log formant ratio, so x also fixes the formant scale), the pole as treatment-coded fixed
effects (reference: the first pole), and crossed random intercepts for passage and base
voice, fitted by Laplace (`voicebias.analysis.glmm`, the criterion of lme4's `glmer`).

Estimands per pole and scope: the slope b_x (log-odds per semitone: how much the system
listens to the voice), the point of subjective equality PSE = -(b0 + b_pole) / b_x (where
P = 0.5), and the content shift PSE(feminine) - PSE(masculine) = -(b_fem - b_masc) / b_x.
PSEs and the shift are ratios of coefficients; their intervals are Fieller's (1954), the
set of values a Wald t test on the linear combination does not reject. A slope whose interval
holds 0 makes them unbounded: the row then says "does not follow the voice" and gives no PSE.
Lapse rates come from a separate fixed-effect fit with asymptotes (Wichmann & Hill, 2001).

See docs/psychometric.md.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
from scipy import optimize, special, stats

from voicebias.analysis.glmm import fit_binomial_glmm
from voicebias.analysis.stats import detect_separation, firth_fit
from voicebias.analysis.status import NOT_ESTIMABLE, OK, SEPARATION, STATUS_COLUMNS, NotEstimable
from voicebias.stimuli.continuum import Continuum

#: the content poles whose boundaries are compared, in the order of the shift (second minus first)
POLES = ("masculine", "feminine")
#: the largest lapse rate the asymptote fit allows, at either end
MAX_LAPSE = 0.5
#: points along the continuum at which a fitted function is written out (for the report's figure)
CURVE_POINTS = 31

PSYCHOMETRIC_COLUMNS = [
    "system",
    "task",
    "lang",
    "quantity",
    "pole",
    "estimate",
    "se",
    "ci_low",
    "ci_high",
    "df",
    "p_value",
    "unit",
    "estimate_vtl_pct",
    "ci_low_vtl_pct",
    "ci_high_vtl_pct",
    "follows_voice",
    "n",
    "passages",
    "base_voices",
    "sd_passage",
    "sd_base_voice",
    *STATUS_COLUMNS,
]


def fieller(u: float, v: float, var_u: float, var_v: float, cov_uv: float, q: float) -> tuple[float, float]:
    """Fieller's interval for -u / v: the values t with |u + t v| / sd(u + t v) <= q.

    Bounded when v is significantly different from 0 at the critical value q (v^2 > q^2 var_v);
    otherwise (nan, nan), the interval being the whole line or its complement.

    >>> lo, hi = fieller(-2.0, 1.0, 0.0, 0.0, 0.0, 1.96)  # no uncertainty: the point itself
    >>> round(lo, 6), round(hi, 6)
    (2.0, 2.0)
    >>> fieller(-2.0, 0.1, 0.01, 0.01, 0.0, 1.96)  # a slope within 1.96 SE of 0: unbounded
    (nan, nan)
    """
    a = v * v - q * q * var_v
    b = 2 * (u * v - q * q * cov_uv)
    c = u * u - q * q * var_u
    if a <= 0:
        return float("nan"), float("nan")
    disc = max(b * b - 4 * a * c, 0.0)
    r = math.sqrt(disc)
    return (-b - r) / (2 * a), (-b + r) / (2 * a)


def lapse_rates(x: np.ndarray, y: np.ndarray, X_rest: np.ndarray) -> tuple[float, float]:
    """(guess, lapse): the lower and upper asymptotes' distances from 0 and 1, by maximum likelihood.

    P(female) = guess + (1 - guess - lapse) * expit(X_rest b + b_x x), fixed effects only, each
    rate in [0, MAX_LAPSE]. `guess` is the share of "female" left at the male end of an infinitely
    long continuum, `lapse` the share of "male" at the female end (Wichmann & Hill, 2001)."""
    X = np.column_stack([X_rest, x])
    k = X.shape[1]

    def nll(z: np.ndarray) -> tuple[float, np.ndarray]:
        g, lam, beta = z[0], z[1], z[2:]
        s = special.expit(X @ beta)
        p = np.clip(g + (1 - g - lam) * s, 1e-12, 1 - 1e-12)
        dp = -(y / p - (1 - y) / (1 - p))  # d(-loglik)/dp per row
        grad = np.concatenate([[dp @ (1 - s), -(dp @ s)], X.T @ (dp * (1 - g - lam) * s * (1 - s))])
        return -float(np.sum(y * np.log(p) + (1 - y) * np.log1p(-p))), grad

    start = np.concatenate([[0.01, 0.01], np.zeros(k)])
    bounds = [(0.0, MAX_LAPSE), (0.0, MAX_LAPSE)] + [(-50.0, 50.0)] * k
    res = optimize.minimize(nll, start, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": 5000})
    return float(res.x[0]), float(res.x[1])


def _design(d: pd.DataFrame, poles: Sequence[str], langs: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    cols = [np.ones(len(d))]
    names = ["(Intercept)"]
    for lang in langs[1:]:
        cols.append((d["lang"] == lang).to_numpy(float))
        names.append(f"lang[{lang}]")
    for pole in poles[1:]:
        cols.append((d["pole"] == pole).to_numpy(float))
        names.append(f"pole[{pole}]")
    cols.append(d["x_st"].to_numpy(float))
    names.append("x_st")
    return np.column_stack(cols), names


def psychometric_scope(
    d: pd.DataFrame,
    continuum: Continuum,
    system: str = "",
    task: str = "describe",
    scope: str = "ALL",
    poles: Sequence[str] = POLES,
    confidence: float = 0.95,
    curves: list[dict] | None = None,
) -> pd.DataFrame:
    """The psychometric function of one system, task and scope (a language, or ALL pooled).

    `d` has one row per answer: `y` (1 female / "she", 0 male / "he"; a share with `trials`
    for pronoun counts), `step` (0 .. steps - 1), `pole`, `passage_id`, `base_voice` and, for
    the pooled scope, `lang` (a fixed effect: each language keeps its own intercept, and the
    PSEs are those of the first language; the slope and the shift are common). Rows with a
    missing `y` are counted out (`n` counts the rest).

    Returns rows: `slope` (log-odds per semitone, Wald t CI), `pse` per pole and `shift` (in
    st, Fieller CIs, and in percent VTL), `guess` and `lapse`. Degenerate tables give rows with
    a status (docs/status.md): no answers, one pole, one outcome, separation (Firth's fixed-effect
    point estimates, no CI), a fit the data cannot support.

    `curves`, when given, receives the fitted function per pole (for the first language of a pooled
    scope) at CURVE_POINTS points of x with its pointwise `confidence` band on the logit scale:
    dicts of system, task, lang, pole, x_st, p, p_low, p_high.
    """
    d = d[d["y"].notna()].copy()
    d = d[d["pole"].isin(poles)]
    d["x_st"] = [continuum.semitones(s) for s in d["step"]]
    langs = sorted(d["lang"].unique()) if "lang" in d.columns and scope == "ALL" else []
    trials = d["trials"].to_numpy(float) if "trials" in d.columns else None
    base = {
        "system": system,
        "task": task,
        "lang": scope,
        "n": int(len(d)),
        "passages": int(d["passage_id"].nunique()),
        "base_voices": int(d["base_voice"].nunique()),
    }
    quantities = [("slope", ""), *[("pse", p) for p in poles], ("shift", f"{poles[1]} - {poles[0]}")]
    quantities += [("guess", ""), ("lapse", "")]

    def rows_with(status: str, reason: str, values: dict | None = None) -> pd.DataFrame:
        out = []
        for q, pole in quantities:
            row = {**base, "quantity": q, "pole": pole, "unit": _unit(q), **(values or {}).get((q, pole), {})}
            row.setdefault("status", status)
            row.setdefault("reason", reason)
            out.append(row)
        return pd.DataFrame(out, columns=PSYCHOMETRIC_COLUMNS)

    if len(d) == 0:
        return rows_with(NOT_ESTIMABLE, "no answer on the continuum")
    present = [p for p in poles if (d["pole"] == p).any()]
    if len(present) < len(poles):
        missing = ", ".join(p for p in poles if p not in present)
        return rows_with(NOT_ESTIMABLE, f"no answer for the {missing} pole")
    y = d["y"].to_numpy(float)
    if np.all(y == y[0]) and trials is None:
        return rows_with(NOT_ESTIMABLE, f"every answer is '{'female' if y[0] == 1 else 'male'}'")
    X, names = _design(d, poles, langs)
    ix = names.index("x_st")
    pole_ix = {p: (names.index(f"pole[{p}]") if p != poles[0] else None) for p in poles}
    guess, lapse = (float("nan"), float("nan"))
    if trials is None:
        guess, lapse = lapse_rates(d["x_st"].to_numpy(float), y, X[:, :ix])
    asym = {("guess", ""): {"estimate": guess}, ("lapse", ""): {"estimate": lapse}}
    sep = detect_separation(X, y) if trials is None else "none"
    if sep != "none":
        beta, _ = firth_fit(X, y)
        vals = {**asym, ("slope", ""): {"estimate": float(beta[ix])}}
        for p in poles:
            u = beta[0] + (beta[pole_ix[p]] if pole_ix[p] is not None else 0.0)
            vals[("pse", p)] = _in_units(continuum, -u / beta[ix])
        shift = -(_pole_coef(beta, pole_ix, poles[1]) - _pole_coef(beta, pole_ix, poles[0])) / beta[ix]
        vals[("shift", f"{poles[1]} - {poles[0]}")] = _in_units(continuum, shift, difference=True)
        return rows_with(
            SEPARATION,
            f"{sep} separation: the boundary is sharper than the answers can resolve, so the mixed model's "
            "estimate does not exist; the estimates are Firth's (fixed effects only), with no interval",
            vals,
        )
    groups = {"passage": d["passage_id"].astype(str), "base_voice": d["base_voice"].astype(str)}
    try:
        fit = fit_binomial_glmm(y, X, names, groups, trials=trials)
    except NotEstimable as exc:
        return rows_with(NOT_ESTIMABLE, str(exc))
    b, V = fit.params.to_numpy(float), fit.cov.to_numpy(float)
    df_x = float(fit.between_df["x_st"])
    df_pole = min(float(fit.between_df[f"pole[{p}]"]) for p in poles[1:])
    notes = []
    if fit.boundary:
        notes.append(f"random-intercept SD estimated 0: {', '.join(fit.boundary)}")
    if not fit.converged:
        notes.append("the optimiser reported no convergence")
    sds = {"sd_passage": float(fit.theta["passage"]), "sd_base_voice": float(fit.theta["base_voice"])}
    alpha = 1 - confidence

    def t_crit(df: float) -> float:
        return float(stats.t.ppf(1 - alpha / 2, df)) if df > 0 else float("nan")

    bx, se_x = b[ix], math.sqrt(V[ix, ix])
    q_x = t_crit(df_x)
    slope_lo, slope_hi = bx - q_x * se_x, bx + q_x * se_x
    follows = bool(slope_lo > 0)
    vals: dict = {
        **asym,
        ("slope", ""): {
            "estimate": bx,
            "se": se_x,
            "ci_low": slope_lo,
            "ci_high": slope_hi,
            "df": df_x,
            "p_value": float(2 * stats.t.sf(abs(bx / se_x), df_x)) if df_x > 0 else float("nan"),
        },
    }
    flat_reason = (
        "does not follow the voice: the slope's interval "
        f"[{slope_lo:.3g}, {slope_hi:.3g}] per st holds 0 or lies below it, so no boundary can be placed"
    )

    def ratio_row(c: np.ndarray, df: float, difference: bool) -> dict:
        """-(c'b) / b_x with Fieller's interval at the t critical value on `df`."""
        u = float(c @ b)
        var_u, cov_uv = float(c @ V @ c), float(c @ V[:, ix])
        est = -u / bx
        if not follows:
            return {"estimate": float("nan"), "df": df, "status": NOT_ESTIMABLE, "reason": flat_reason}
        if not df > 0:
            row = _in_units(continuum, est, difference=difference)
            row["df"] = df
            row["reason"] = "; ".join(
                [*notes, f"no interval: {base['passages']} passages leave no degrees of freedom for the content pole"]
            )
            return row
        lo, hi = fieller(u, bx, var_u, V[ix, ix], cov_uv, t_crit(df))
        row = _in_units(continuum, est, lo, hi, difference=difference)
        row["df"] = df
        if not np.isfinite(lo):
            row["reason"] = "; ".join(
                [*notes, f"Fieller's interval is unbounded: the slope is within {t_crit(df):.3g} SE of 0 at {df:g} df"]
            )
        # the delta-method SE, for reference (the interval is Fieller's)
        grad = -c / bx
        grad[ix] += u / bx**2
        row["se"] = float(math.sqrt(max(grad @ V @ grad, 0.0)))
        return row

    for p in poles:
        c = np.zeros(len(b))
        c[0] = 1.0
        if pole_ix[p] is not None:
            c[pole_ix[p]] = 1.0
        vals[("pse", p)] = ratio_row(c, min(df_x, df_pole), difference=False)
    c = np.zeros(len(b))
    for sign, p in ((1.0, poles[1]), (-1.0, poles[0])):
        if pole_ix[p] is not None:
            c[pole_ix[p]] += sign
    shift = ratio_row(c, min(df_x, df_pole), difference=True)
    w = float(c @ b) / math.sqrt(float(c @ V @ c))
    # the test of the shift is the test of b_fem - b_masc = 0, meaningful as a shift only where there is a boundary
    shift["p_value"] = float(2 * stats.t.sf(abs(w), df_pole)) if df_pole > 0 and follows else float("nan")
    vals[("shift", f"{poles[1]} - {poles[0]}")] = shift
    out = rows_with(OK, "; ".join(notes), vals)
    for k, v in sds.items():
        out[k] = v
    out["follows_voice"] = follows
    if curves is not None:
        z = float(stats.norm.ppf(1 - alpha / 2))
        for p in poles:
            for x in np.linspace(0.0, continuum.span_st, CURVE_POINTS):
                c = np.zeros(len(b))
                c[0], c[ix] = 1.0, x
                if pole_ix[p] is not None:
                    c[pole_ix[p]] = 1.0
                eta, se = float(c @ b), math.sqrt(max(float(c @ V @ c), 0.0))
                curves.append(
                    {
                        "system": system,
                        "task": task,
                        "lang": scope,
                        "pole": p,
                        "x_st": round(float(x), 6),
                        "p": float(special.expit(eta)),
                        "p_low": float(special.expit(eta - z * se)),
                        "p_high": float(special.expit(eta + z * se)),
                    }
                )
    return out


def _pole_coef(beta: np.ndarray, pole_ix: dict, pole: str) -> float:
    return float(beta[pole_ix[pole]]) if pole_ix[pole] is not None else 0.0


def _unit(quantity: str) -> str:
    return {"slope": "log-odds per st", "pse": "st above the male endpoint", "shift": "st"}.get(quantity, "share")


def _in_units(
    continuum: Continuum, est: float, lo: float = float("nan"), hi: float = float("nan"), difference: bool = False
) -> dict:
    """A position (or, with `difference`, a distance) in st with its VTL equivalent in percent."""
    f = continuum.vtl_ratio_percent if difference else continuum.vtl_percent
    # the VTL falls as x rises: the interval's ends swap
    return {
        "estimate": float(est),
        "ci_low": float(lo),
        "ci_high": float(hi),
        "estimate_vtl_pct": f(est),
        "ci_low_vtl_pct": f(hi) if np.isfinite(hi) else float("nan"),
        "ci_high_vtl_pct": f(lo) if np.isfinite(lo) else float("nan"),
    }


def psychometric_table(
    answers: pd.DataFrame,
    continuum: Continuum,
    poles: Sequence[str] = POLES,
    confidence: float = 0.95,
    curves: list[dict] | None = None,
    pooled_only: bool = False,
) -> pd.DataFrame:
    """`psychometric_scope` per system x task, pooled over languages (ALL) and, unless `pooled_only`,
    per language.

    `answers` has the columns `psychometric_scope` reads plus `system`, `task` and `lang`, and a
    `status` column whose failed calls are left out (they are counted by the runner's tables).
    `curves` collects each fit's function (`psychometric_scope`)."""
    d = answers[answers["status"] == "ok"] if "status" in answers.columns else answers
    parts = []
    for (system, task), g in d.groupby(["system", "task"], sort=True):
        parts.append(psychometric_scope(g, continuum, str(system), str(task), "ALL", poles, confidence, curves))
        for lang, gl in g.groupby("lang", sort=True) if not pooled_only else ():
            parts.append(
                psychometric_scope(gl, continuum, str(system), str(task), str(lang), poles, confidence, curves)
            )
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=PSYCHOMETRIC_COLUMNS)
