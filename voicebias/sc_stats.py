"""Statistics of the speech-continuation study (SC paper), as tidy DataFrames.

- success rate per system and the all-systems-succeeded filter;
- speaker similarity by system x phonation x gender (SC paper, Table 2);
- linear mixed models with type-III Wald tests (sum-to-zero contrasts) and
  Tukey-adjusted pairwise contrasts of estimated marginal means;
- beta regression of rescaled judge scores with non-significant interactions
  removed stepwise by likelihood-ratio tests.
"""

from __future__ import annotations

import itertools
import re
import warnings
from typing import Iterable

import numpy as np
import pandas as pd
import statsmodels.formula.api as smf
from patsy import build_design_matrices
from scipy import stats


def success_table(df: pd.DataFrame) -> pd.DataFrame:
    """Share of continuation calls that succeeded, per system."""
    g = df.groupby("system")["status"]
    return pd.DataFrame({"n": g.size(), "succeeded": g.apply(lambda s: int((s == "ok").sum()))}).assign(
        success_rate=lambda x: x["succeeded"] / x["n"]).reset_index()


def all_systems_succeeded(df: pd.DataFrame, key: str = "stimulus_id") -> pd.DataFrame:
    """Rows of the inputs on which every system succeeded (the SC paper's comparison set)."""
    systems = df["system"].nunique()
    ok = df[df["status"] == "ok"].groupby(key)["system"].nunique()
    keep = set(ok[ok == systems].index)
    return df[df[key].isin(keep) & (df["status"] == "ok")]


def similarity_table(df: pd.DataFrame, value: str = "speaker_similarity") -> pd.DataFrame:
    """Mean (SD, n) speaker similarity by system x phonation x voice gender."""
    g = df.groupby(["system", "phonation", "voice_gender"])[value]
    return g.agg(mean="mean", sd="std", n="size").reset_index()


def _factor_terms(formula_rhs: str) -> list[str]:
    return [t.strip() for t in formula_rhs.split("+") if t.strip()]


def type3_wald(fit, term_names: Iterable[str] | None = None) -> pd.DataFrame:
    """Type-III Wald chi-square test per model term (fit with sum-to-zero contrasts).

    Each term's coefficients are tested jointly against zero with the fitted
    covariance; with sum-to-zero coding this is the type-III hypothesis.
    """
    params = fit.fe_params if hasattr(fit, "fe_params") else fit.params
    names = list(params.index)
    cov = fit.cov_params().loc[names, names].to_numpy()
    groups: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        if n == "Intercept":
            continue
        term = ":".join(re.sub(r"\[.*?\]$", "", part) for part in n.split(":"))
        groups.setdefault(term, []).append(i)
    rows = []
    for term, idx in groups.items():
        if term_names is not None and term not in term_names:
            continue
        b = params.to_numpy()[idx]
        v = cov[np.ix_(idx, idx)]
        chi2 = float(b @ np.linalg.solve(v, b))
        rows.append({"term": term, "chi2": chi2, "df": len(idx), "p_value": float(stats.chi2.sf(chi2, len(idx)))})
    return pd.DataFrame(rows)


def emm_pairwise(fit, data: pd.DataFrame, factor: str, by: list[str] | None = None,
                 df_resid: float | None = None) -> pd.DataFrame:
    """Estimated marginal means of `factor` (within each `by` cell) and Tukey-adjusted pairwise contrasts.

    EMMs average the model's predictions over an equally weighted grid of all other
    factors in the model. p-values use the studentized range with df_resid
    (residual df for OLS; None = asymptotic, as for mixed models).
    """
    by = by or []
    design = fit.model.data.model_spec
    factors = [c for c in data.columns if c in _model_factors(fit)]
    levels = {f: sorted(data[f].dropna().unique()) for f in factors}
    grid = pd.DataFrame(list(itertools.product(*levels.values())), columns=list(levels))
    for col in data.columns:
        if col not in grid:
            grid[col] = data[col].iloc[0]
    X = np.asarray(build_design_matrices([design], grid)[0])
    params = (fit.fe_params if hasattr(fit, "fe_params") else fit.params)
    beta = params.to_numpy()
    cov = fit.cov_params().loc[params.index, params.index].to_numpy()
    df = np.inf if df_resid is None else float(df_resid)
    rows = []
    by_cells = grid[by].drop_duplicates().itertuples(index=False) if by else [()]
    for cell in by_cells:
        mask = np.ones(len(grid), bool)
        for f, v in zip(by, cell):
            mask &= (grid[f] == v).to_numpy()
        L = {lv: X[mask & (grid[factor] == lv).to_numpy()].mean(axis=0) for lv in levels[factor]}
        k = len(L)
        for a, b in itertools.combinations(levels[factor], 2):
            c = L[a] - L[b]
            est = float(c @ beta)
            se = float(np.sqrt(c @ cov @ c))
            t = est / se if se > 0 else np.nan
            p = float(stats.studentized_range.sf(abs(t) * np.sqrt(2), k, df)) if np.isfinite(t) else np.nan
            rows.append({**dict(zip(by, cell)), "factor": factor, "level_a": a, "level_b": b, "estimate": est,
                         "se": se, "t": t, "p_tukey": min(p, 1.0)})
    return pd.DataFrame(rows)


def _model_factors(fit) -> set[str]:
    formula = fit.model.formula
    return set(re.findall(r"C\((\w+)", formula)) | {w for w in re.findall(r"\b(\w+)\b", formula.split("~")[1])
                                                    if w not in {"C", "Sum", "Treatment"}}


def voice_quality_models(df: pd.DataFrame, measures: Iterable[str] = ("h1h2_db", "h1a3_db", "cpps_db"),
                         factors: Iterable[str] = ("source", "voice_gender", "phonation", "system"),
                         group: str = "stimulus_id") -> dict[str, pd.DataFrame]:
    """Mixed model per voice-quality measure: full factorial of `factors` + (1 | group).

    Returns {'type3': Wald tests per measure x term, 'contrasts': Tukey-adjusted
    pairwise contrasts of source (prompt vs continuation) within every other cell,
    'fits': convergence per measure}.
    """
    factors = [f for f in factors if f in df and df[f].nunique() > 1]
    rhs = "*".join(f"C({f}, Sum)" for f in factors)
    t3, contrasts, fits = [], [], []
    for m in measures:
        d = df.dropna(subset=[m])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit = smf.mixedlm(f"{m} ~ {rhs}", d, groups=d[group]).fit(reml=True)
        t3.append(type3_wald(fit).assign(measure=m))
        if "source" in factors:
            others = [f for f in factors if f != "source"]
            contrasts.append(emm_pairwise(fit, d[factors + [m]], "source", by=others).assign(measure=m))
        fits.append({"measure": m, "n": len(d), "converged": bool(fit.converged),
                     "warning": "; ".join(sorted({str(w.message).split(chr(10))[0] for w in caught}))})
    return {"type3": pd.concat(t3, ignore_index=True),
            "contrasts": pd.concat(contrasts, ignore_index=True) if contrasts else pd.DataFrame(),
            "fits": pd.DataFrame(fits)}


def rescale_scores(scores: pd.Series, low: float = 1.0, high: float = 5.0) -> pd.Series:
    """Map bounded scores into (0, 1) for beta regression (Smithson & Verkuilen, 2006):
    y' = ((y - low) / (high - low) * (n - 1) + 0.5) / n."""
    n = scores.notna().sum()
    return ((scores - low) / (high - low) * (n - 1) + 0.5) / n


def _terms_formula(y: str, terms: list[frozenset]) -> str:
    parts = [":".join(f"C({f}, Sum)" for f in sorted(t)) for t in sorted(terms, key=lambda t: (len(t), sorted(t)))]
    return f"{y} ~ " + (" + ".join(parts) if parts else "1")


def _fit_beta(formula: str, data: pd.DataFrame):
    from statsmodels.othermod.betareg import BetaModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BetaModel.from_formula(formula, data).fit(disp=0, maxiter=500)


def beta_regression_stepwise(df: pd.DataFrame, y: str, factors: Iterable[str], alpha: float = 0.05) -> dict[str, pd.DataFrame]:
    """Beta regression of y (in (0, 1)) on the full factorial of `factors`, then stepwise removal.

    At each step every interaction not contained in a higher-order remaining term
    is tested by a likelihood-ratio test against the model without it; the least
    significant one with p > alpha is dropped; main effects are kept. Returns the
    removal steps and the final model's coefficients.
    """
    factors = list(factors)
    terms = [frozenset(c) for r in range(1, len(factors) + 1) for c in itertools.combinations(factors, r)]
    steps = []
    fit = _fit_beta(_terms_formula(y, terms), df)
    while True:
        candidates = [t for t in terms if len(t) > 1 and not any(t < u for u in terms)]
        tests = []
        for t in candidates:
            reduced = [u for u in terms if u != t]
            rfit = _fit_beta(_terms_formula(y, reduced), df)
            lr = 2 * (fit.llf - rfit.llf)
            ddf = len(fit.params) - len(rfit.params)
            tests.append((float(stats.chi2.sf(max(lr, 0.0), ddf)), t, lr, ddf, rfit))
        removable = [x for x in tests if x[0] > alpha]
        if not removable:
            break
        p, t, lr, ddf, rfit = max(removable, key=lambda x: x[0])
        steps.append({"removed": ":".join(sorted(t)), "lr": lr, "df": ddf, "p_value": p})
        terms = [u for u in terms if u != t]
        fit = rfit
    coefs = pd.DataFrame({"term": fit.params.index, "estimate": fit.params.to_numpy(), "se": fit.bse.to_numpy(),
                          "p_value": fit.pvalues.to_numpy()})
    kept = [":".join(sorted(t)) for t in terms if len(t) > 1]
    return {"steps": pd.DataFrame(steps, columns=["removed", "lr", "df", "p_value"]), "coefficients": coefs,
            "kept_interactions": pd.DataFrame({"term": kept}), "llf": pd.DataFrame([{"llf": fit.llf}])}
