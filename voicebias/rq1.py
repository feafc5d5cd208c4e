"""RQ1 (voice rendering): does the content stereotype move the rendered voice?

Estimand (S2S paper, sec. 4): the baseline-corrected contrast
Delta_misaligned - Delta_neutral, per input voice gender, where Delta is output
minus input on a measure (the femininity composite by default). The predicted
sign is + for a male voice with feminine content and - for a female voice with
masculine content; `signed_contrast` multiplies by it, so a positive value always
means 'toward the stereotype'. Describe is not scored acoustically (its output is
the judgment word itself); translate changes the phoneme inventory and is
reported separately (`task_group`).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import statsmodels.formula.api as smf
from scipy import stats

ACOUSTIC_TASKS = ("readback", "paraphrase", "summarize", "translate")
MISALIGNED = {"male": "feminine", "female": "masculine"}
PREDICTED_SIGN = {"male": 1.0, "female": -1.0}


def task_group(task: str) -> str:
    return "cross-lingual" if task == "translate" else "same-language"


def cohens_d(a: np.ndarray, b: np.ndarray) -> float:
    """Standardised mean difference (a - b) / pooled SD."""
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        return np.nan
    sp = np.sqrt(((na - 1) * np.var(a, ddof=1) + (nb - 1) * np.var(b, ddof=1)) / (na + nb - 2))
    return float((np.mean(a) - np.mean(b)) / sp) if sp > 0 else np.nan


def _ok(acoustic: pd.DataFrame, measure: str) -> pd.DataFrame:
    d = acoustic[(acoustic["status"] == "ok") & acoustic["task"].isin(ACOUSTIC_TASKS)]
    return d[np.isfinite(d[measure].astype(float))]


def rq1_contrasts(acoustic: pd.DataFrame, measure: str = "delta_composite") -> pd.DataFrame:
    """Misaligned vs neutral per system x language x task x input voice: contrast, Welch t, Cohen's d."""
    rows = []
    d = _ok(acoustic, measure)
    for (system, lang, task, voice), g in d.groupby(["system", "lang", "task", "voice_gender"]):
        mis = g.loc[g["pole"] == MISALIGNED[voice], measure].to_numpy(float)
        neu = g.loc[g["pole"] == "neutral", measure].to_numpy(float)
        if len(mis) < 2 or len(neu) < 2:
            continue
        t = stats.ttest_ind(mis, neu, equal_var=False)
        contrast = float(mis.mean() - neu.mean())
        rows.append({
            "system": system, "lang": lang, "task": task, "task_group": task_group(task), "voice_gender": voice,
            "measure": measure, "n_misaligned": len(mis), "n_neutral": len(neu), "delta_misaligned": float(mis.mean()),
            "delta_neutral": float(neu.mean()), "contrast": contrast,
            "signed_contrast": contrast * PREDICTED_SIGN[voice], "t": float(t.statistic) if np.isfinite(t.statistic) else np.nan,
            "p_value": float(t.pvalue) if np.isfinite(t.pvalue) else np.nan, "cohens_d": cohens_d(mis, neu),
        })
    return pd.DataFrame(rows)


def rq1_mixed_models(acoustic: pd.DataFrame, measure: str = "delta_composite") -> pd.DataFrame:
    """Per system x language x task: measure ~ content * voice + (1 | passage); Wald test of the interaction.

    The random intercept is per passage (the utterance voiced by both voices).
    Reports the interaction's chi-square (2 df), p, the fit's convergence and any
    fitting warning, so a singular or non-converged fit is visible as such.
    """
    rows = []
    d = _ok(acoustic, measure).rename(columns={measure: "y"})
    for (system, lang, task), g in d.groupby(["system", "lang", "task"]):
        row = {"system": system, "lang": lang, "task": task, "task_group": task_group(task), "measure": measure,
               "n": len(g), "chi2_interaction": np.nan, "df": 2, "p_interaction": np.nan, "converged": False,
               "warning": ""}
        if g["y"].std() == 0 or g["passage_id"].nunique() < 3:
            row["warning"] = "no variance or too few passages"
            rows.append(row)
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                fit = smf.mixedlm("y ~ C(pole, Treatment('neutral')) * C(voice_gender)", g,
                                  groups=g["passage_id"]).fit(reml=True)
            except (np.linalg.LinAlgError, ValueError) as exc:
                row["warning"] = f"fit failed: {exc}"
                rows.append(row)
                continue
        names = [n for n in fit.fe_params.index if ":" in n]
        R = np.zeros((len(names), len(fit.fe_params)))
        for i, n in enumerate(names):
            R[i, list(fit.fe_params.index).index(n)] = 1.0
        b = R @ fit.fe_params.to_numpy()
        cov = R @ fit.cov_params().loc[fit.fe_params.index, fit.fe_params.index].to_numpy() @ R.T
        try:
            chi2 = float(b @ np.linalg.solve(cov, b))
            row.update(chi2_interaction=chi2, df=len(names), p_interaction=float(stats.chi2.sf(chi2, len(names))))
        except np.linalg.LinAlgError:
            row["warning"] = "singular covariance of the interaction terms"
        row["converged"] = bool(fit.converged)
        msgs = sorted({str(w.message).split("\n")[0] for w in caught})
        if msgs:
            row["warning"] = "; ".join([row["warning"], *msgs]).strip("; ")
        rows.append(row)
    return pd.DataFrame(rows)


def rq1_pooled(acoustic: pd.DataFrame, measure: str = "delta_composite", confidence: float = 0.95) -> pd.DataFrame:
    """The pooled stereotype-signed contrast per system and task group, with its CI.

    Outputs of the same voiced passage (one per task of the group) are averaged
    first, since they share one input. Each language x input-voice cell then gives
    a contrast (mean of its misaligned voiced passages minus mean of its neutral
    ones, times the predicted sign) with the Welch variance of that difference;
    the pooled contrast is the mean over cells, its variance the mean of the cell
    variances divided by the number of cells, with Welch-Satterthwaite degrees of
    freedom. Both the misaligned and the neutral passages' spread enter the CI.
    """
    d = _ok(acoustic, measure).copy()
    d["task_group"] = d["task"].map(task_group)
    per_passage = d.groupby(["system", "task_group", "lang", "voice_gender", "pole", "stimulus_id"])[measure].mean().reset_index()
    rows = []
    for (system, group), g in per_passage.groupby(["system", "task_group"]):
        contrasts, variances, dfs_parts, n_units = [], [], [], 0
        for (lang, voice), c in g.groupby(["lang", "voice_gender"]):
            mis = c.loc[c["pole"] == MISALIGNED[voice], measure].to_numpy(float)
            neu = c.loc[c["pole"] == "neutral", measure].to_numpy(float)
            if len(mis) < 2 or len(neu) < 2:
                continue
            vm, vn = np.var(mis, ddof=1) / len(mis), np.var(neu, ddof=1) / len(neu)
            contrasts.append((mis.mean() - neu.mean()) * PREDICTED_SIGN[voice])
            variances.append(vm + vn)
            dfs_parts += [(vm, len(mis) - 1), (vn, len(neu) - 1)]
            n_units += len(mis) + len(neu)
        if not contrasts:
            continue
        k = len(contrasts)
        est = float(np.mean(contrasts))
        var = float(np.sum(variances) / k**2)
        se = np.sqrt(var)
        denom = sum((v / k**2) ** 2 / df for v, df in dfs_parts if df > 0)
        df = float((var**2) / denom) if denom > 0 else np.nan
        half = float(stats.t.ppf(0.5 + confidence / 2, df) * se) if se > 0 else 0.0
        rows.append({"system": system, "task_group": group, "measure": measure, "n_cells": k,
                     "n_voiced_passages": n_units, "pooled_contrast": est, "se": float(se), "df": df,
                     "ci_low": est - half, "ci_high": est + half,
                     "p_value": float(2 * stats.t.sf(abs(est / se), df)) if se > 0 else np.nan})
    return pd.DataFrame(rows)
