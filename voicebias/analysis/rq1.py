"""RQ1 (voice rendering): does the content stereotype move the rendered voice?

Estimand (S2S paper, sec. 4): the baseline-corrected contrast Delta_misaligned - Delta_neutral,
per input voice gender, where Delta is output minus input on a measure (the femininity composite
by default); `signed_contrast` is signed so that a positive value always means 'toward the
stereotype'. Describe is not scored acoustically; translate is reported separately (`task_group`).
With repeats every function first averages each item's samples
(voicebias.analysis.repeats.item_means).

See docs/rq1.md.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.regression.mixed_linear_model import MixedLM

from voicebias.analysis.mixed import f_test, fit_reml_matrices
from voicebias.analysis.repeats import has_repeats, item_means
from voicebias.analysis.rounding import is_constant, magnitude, negligible
from voicebias.analysis.status import NOT_ESTIMABLE, OK, STATUS_COLUMNS
from voicebias.parallel import map_processes

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
    """The measured rows of the acoustic tasks with a finite `measure`; with repeats one row per
    item, its measure the mean over those of its samples."""
    d = acoustic[(acoustic["status"] == "ok") & acoustic["task"].isin(ACOUSTIC_TASKS)]
    d = d[np.isfinite(d[measure].astype(float))]
    if has_repeats(d):
        d = item_means(d, [measure])
    return d


CONTRAST_COLUMNS = [
    "system",
    "lang",
    "task",
    "task_group",
    "voice_gender",
    "measure",
    "units",
    "n_misaligned",
    "n_neutral",
    "delta_misaligned",
    "delta_neutral",
    "contrast",
    "signed_contrast",
    "t",
    "p_value",
    "cohens_d",
    *STATUS_COLUMNS,
]


def rq1_contrasts(acoustic: pd.DataFrame, measure: str = "delta_composite") -> pd.DataFrame:
    """Misaligned vs neutral per system x language x task x input voice: contrast, Welch t, Cohen's d.

    Every system x language x task x voice with measured outputs gives a row. status is
    'ok' when the Welch test was made, 'not estimable' (reason says why) when a cell has
    fewer than 2 outputs (the means and contrast are then given where they exist) or
    both cells are constant (no variance: no test).
    """
    rows = []
    d = _ok(acoustic, measure)
    for (system, lang, task, voice), g in d.groupby(["system", "lang", "task", "voice_gender"]):
        mis = g.loc[g["pole"] == MISALIGNED[voice], measure].to_numpy(float)
        neu = g.loc[g["pole"] == "neutral", measure].to_numpy(float)
        tstat = pval = np.nan
        few = [
            f"{len(x)} {name} output{'s' if len(x) != 1 else ''}"
            for name, x in ((f"misaligned ({MISALIGNED[voice]})", mis), ("neutral", neu))
            if len(x) < 2
        ]
        if few:
            status, reason = NOT_ESTIMABLE, f"fewer than 2 outputs in a cell ({', '.join(few)}): no test"
        elif all(negligible(np.ptp(x), magnitude([*mis, *neu])) for x in (mis, neu)):
            # constant in both cells (e.g. net 0 everywhere): no test
            status, reason = NOT_ESTIMABLE, "no variance: the measure is constant in both cells"
        else:
            t = stats.ttest_ind(mis, neu, equal_var=False)
            tstat, pval = float(t.statistic), float(t.pvalue)
            status, reason = (OK, "") if np.isfinite(pval) else (NOT_ESTIMABLE, "the Welch test is undefined")
        contrast = float(mis.mean() - neu.mean()) if len(mis) and len(neu) else np.nan
        rows.append(
            {
                "system": system,
                "lang": lang,
                "task": task,
                "task_group": task_group(task),
                "voice_gender": voice,
                "measure": measure,
                "units": units_of(measure),
                "n_misaligned": len(mis),
                "n_neutral": len(neu),
                "delta_misaligned": float(mis.mean()) if len(mis) else np.nan,
                "delta_neutral": float(neu.mean()) if len(neu) else np.nan,
                "contrast": contrast,
                "signed_contrast": contrast * PREDICTED_SIGN[voice],
                "t": tstat if np.isfinite(tstat) else np.nan,
                "p_value": pval if np.isfinite(pval) else np.nan,
                "cohens_d": cohens_d(mis, neu),
                "status": status,
                "reason": reason,
            }
        )
    return pd.DataFrame(rows, columns=CONTRAST_COLUMNS)


MIXED_FORMULA = "y ~ C(pole, Treatment('neutral')) * C(voice_gender)"
STEREOTYPE_STEP = {"masculine": -1.0, "neutral": 0.0, "feminine": 1.0}
UNITS = {"delta_composite": "SD", "delta_f0_median_st": "st", "delta_formant_index": "oct", "delta_vtl_index": "oct"}


def units_of(measure: str) -> str:
    """Units of a delta_ (output - input) or net_ (output - text control) measure: st (F0,
    semitones), SD (composite), oct (formant index, octaves), logit (classifier margin,
    female minus male), '' when unknown."""
    base = "delta_" + measure.removeprefix("net_") if measure.startswith("net_") else measure
    return UNITS.get(base, "logit" if base.startswith("delta_margin_") else "")


EFFECTS = ("stereotype_effect", "misaligned_minus_neutral")
EFFECT_FIELDS = ("est", "se", "df", "ci_low", "ci_high", "p")


def effect_weights(cells: pd.DataFrame) -> dict[str, np.ndarray]:
    """Weights on the six pole x voice cell means for the 1-df RQ1 effects.

    stereotype_effect: the per-step content slope with content coded toward its
    stereotype (masculine -1, neutral 0, feminine +1), the mean over both voices of
    (mu_feminine - mu_masculine) / 2; positive = the output moves toward the content
    stereotype, in the measure's units per content step. misaligned_minus_neutral:
    the mean over voices of (mu_misaligned - mu_neutral) times the predicted sign
    (+ male voice, - female voice), i.e. the baseline-corrected H1 estimand.
    `cells` has one row per cell with pole and voice_gender.
    """
    stereo = np.array([STEREOTYPE_STEP[p] / 2 / 2 for p in cells["pole"]])
    mis = np.zeros(len(cells))
    for i, (pole, voice) in enumerate(zip(cells["pole"], cells["voice_gender"])):
        if pole == MISALIGNED[voice]:
            mis[i] = PREDICTED_SIGN[voice] / 2
        elif pole == "neutral":
            mis[i] = -PREDICTED_SIGN[voice] / 2
    return {"stereotype_effect": stereo, "misaligned_minus_neutral": mis}


_CELLS = pd.DataFrame(
    [(p, v) for p in ("masculine", "neutral", "feminine") for v in ("male", "female")], columns=["pole", "voice_gender"]
)


def _has_every_cell(g: pd.DataFrame) -> bool:
    present = set(zip(g["pole"], g["voice_gender"]))
    return all((p, v) in present for p, v in zip(_CELLS["pole"], _CELLS["voice_gender"]))


def _cell_design(g: pd.DataFrame, exog: np.ndarray) -> np.ndarray:
    """The fixed-effects design row of each of the six pole x voice cells (_CELLS order): every row
    of a cell has the same one, so a cell mean is that row times b."""
    first = {key: i for i, key in reversed(list(enumerate(zip(g["pole"], g["voice_gender"]))))}
    return np.array([exog[first[(p, v)]] for p, v in zip(_CELLS["pole"], _CELLS["voice_gender"])])


def rq1_mixed_models(
    acoustic: pd.DataFrame, measure: str = "delta_composite", confidence: float = 0.95
) -> pd.DataFrame:
    """Per system x language x task: measure ~ content * voice + (1 | passage) [+ (1 | voice_id)], REML.

    The random intercept is per passage (the utterance voiced by both voices) and, when a
    gender has more than one input voice (several voices per gender, docs/stimuli.md), also
    per input voice (`voice_id`), so the effects generalise over voices as well as passages;
    `random_effects` and `voices_per_gender` say which model each row is.
    Reports, in this order of interest, two 1-df effects from the fitted cell
    means (`effect_weights`), each with estimate, SE, Satterthwaite df, CI and
    t-test p (columns <effect>_est, _se, _df, _ci_low, _ci_high, _p, in `units`:
    st for F0, SD for the composite):

    - stereotype_effect: per-step shift toward the content stereotype for both
      voices (H1: a stereotype pull moves both voices the same signed way);
    - misaligned_minus_neutral: the signed baseline-corrected contrast, averaged
      over the two voices;

    and the content x voice interaction (H2): its Wald chi-square (2 df) and the F
    test lmerTest reports for it, F = chi2 / 2 on 2 and Satterthwaite denominator df
    (`den_df_interaction`, n - 6 at a singular fit), whose p is p_interaction (the
    chi-square's asymptotic p rejects a true null 7-9 % of the time at alpha .05
    with 30 passages); the fit's convergence and any fitting warning, so a singular or
    non-converged fit is visible as such. The variances are REML estimates
    (`voicebias.analysis.mixed.fit_reml_matrices`, bounded at 0 as lme4); the fixed-effect
    covariance is (X'V^-1 X)^-1 at those variances, as in lme4. When the passage
    variance is at its boundary (0, a singular fit) the df is the residual df of
    the fixed-effects model (n - 6), which is what lmerTest's Satterthwaite df is
    there, and the warning says 'singular fit'. status is 'ok' when the fit converged
    and both effects were estimated with a positive SE (reason: the warning, such as
    'singular fit'), else 'not estimable' (fewer than 3 passages, no neutral outputs,
    a constant measure, an empty pole x voice cell, a failed or non-converged fit, an
    exact fit: the measure a function of content and voice, whose effects are then given
    with SE 0, a zero-width interval and no test), the warning its reason. These switches
    are decided with the margins of voicebias.analysis.rounding, so rounding in the
    inputs does not move a row from one to another.
    """
    rows = []
    d = _ok(acoustic, measure).rename(columns={measure: "y"})
    zcrit_p = 0.5 + confidence / 2
    for (system, lang, task), g in d.groupby(["system", "lang", "task"]):
        row: dict = {
            "system": system,
            "lang": lang,
            "task": task,
            "task_group": task_group(task),
            "measure": measure,
            "units": units_of(measure),
            "n": len(g),
        }
        for eff in EFFECTS:
            row.update({f"{eff}_{f}": np.nan for f in EFFECT_FIELDS})
        row.update(
            chi2_interaction=np.nan,
            df=2,
            f_interaction=np.nan,
            den_df_interaction=np.nan,
            p_interaction=np.nan,
            converged=False,
            warning="",
        )
        # input voices as a random intercept too, when a gender has more than one voice (with one
        # voice each the voice is the fixed voice-gender effect)
        with_voices = (
            "voice_id" in g and g["voice_id"].notna().all() and g["voice_id"].nunique() > g["voice_gender"].nunique()
        )
        row["random_effects"] = "passage + voice" if with_voices else "passage"
        row["voices_per_gender"] = int(g.groupby("voice_gender")["voice_id"].nunique().min()) if "voice_id" in g else 1
        if g["passage_id"].nunique() < 3:
            row["warning"] = "too few passages"
            rows.append(row)
            continue
        if is_constant(g["y"]):
            # every output has the same value (e.g. each equals its text control): the
            # effects are exactly 0 with no sampling variance; no test is possible
            if {(p, v) for p in STEREOTYPE_STEP for v in PREDICTED_SIGN} <= set(zip(g["pole"], g["voice_gender"])):
                for eff in EFFECTS:
                    row.update({f"{eff}_est": 0.0, f"{eff}_se": 0.0, f"{eff}_ci_low": 0.0, f"{eff}_ci_high": 0.0})
            row["warning"] = "no variance: the measure is the same in every output"
            rows.append(row)
            continue
        if "neutral" not in set(g["pole"]):
            row["warning"] = "no neutral outputs (the reference content of the model)"
            rows.append(row)
            continue
        # statsmodels builds the treatment-coded design; the REML fit is voicebias.analysis.mixed's
        model = MixedLM.from_formula(MIXED_FORMULA, g, groups=g["passage_id"])
        exog, names = np.asarray(model.exog, float), list(model.exog_names)
        if np.linalg.matrix_rank(exog) < exog.shape[1]:
            row["warning"] = "design not full rank (an empty pole x voice cell)"
            rows.append(row)
            continue
        if len(g) <= exog.shape[1]:
            row["warning"] = f"no residual degrees of freedom ({len(g)} outputs for {exog.shape[1]} fixed effects)"
            rows.append(row)
            continue
        # the residual variance at its boundary: the outputs of a passage are identical
        # (a fixed output voice reading the same words for both input voices), so all
        # variance is between passages; the effects are then between-passage contrasts,
        # with the between-within df (passages minus the pole means they estimate), and
        # there is no REML fit to make (its likelihood is unbounded there)
        scale = magnitude(g["y"])
        y = g["y"].to_numpy(float)
        ols = np.linalg.lstsq(exog, y, rcond=None)[0]
        if negligible(magnitude(y - exog @ ols), scale) and _has_every_cell(g):
            # the measure is a function of content and voice (every passage of a cell gives the
            # same value): the effects are known exactly, and there is no variance to test them
            # against
            cell_X = _cell_design(g, exog)
            for eff, w in effect_weights(_CELLS).items():
                est = float(w @ cell_X @ ols)
                row.update({f"{eff}_est": est, f"{eff}_se": 0.0, f"{eff}_ci_low": est, f"{eff}_ci_high": est})
            row.update(
                converged=True,
                warning="exact fit: the measure is a function of content and voice (no residual variance): no test",
            )
            rows.append(row)
            continue
        no_residual = negligible(float(g["y"].groupby(g["passage_id"]).std(ddof=0).max()), scale)
        fit = None
        if no_residual:
            theta, converged = np.array([np.nan, 0.0]), True
            beta = ols
            cov = np.full((exog.shape[1], exog.shape[1]), np.nan)
        else:
            random = {"passage": pd.factorize(g["passage_id"])[0]}
            if with_voices:
                random["voice"] = pd.factorize(g["voice_id"])[0]
            try:
                fit = fit_reml_matrices(y, exog, names, random, nobound=False)
                theta, converged = fit.vcomp.to_numpy(float), fit.converged
                beta, cov = fit.params.to_numpy(float), fit.C
            except np.linalg.LinAlgError as exc:
                row["warning"] = f"fit failed: {exc}"
                rows.append(row)
                continue
        singular = theta[0] == 0.0
        # every variance component at 0: the fit is the fixed-effects model, and its residual df is the df
        all_zero = bool(np.all(theta[:-1] == 0.0)) if fit is not None else singular
        between_df = float(g["passage_id"].nunique() - g["pole"].nunique())
        if no_residual:
            converged = True
            msgs: list[str] = ["residual variance 0 (identical outputs within each passage): between-within df"]
        else:
            msgs = [] if converged else ["REML optimum not located"]
        if singular:
            msgs = ["singular fit (passage variance 0)", *msgs]
        if with_voices and fit is not None and theta[1] == 0.0:
            msgs = ["voice variance 0", *msgs]
        cells = _CELLS
        if _has_every_cell(g):
            cell_X = _cell_design(g, exog)
            if no_residual:
                per = g.groupby("passage_id").agg(y=("y", "first"), pole=("pole", "first"))
                pole_mean, pole_n = per.groupby("pole")["y"].mean(), per.groupby("pole")["y"].size()
                s2_between = float(((per["y"] - per["pole"].map(pole_mean)) ** 2).sum() / between_df)
            for eff, w in effect_weights(cells).items():
                L = w @ cell_X
                est, se = float(L @ beta), float(np.sqrt(L @ cov @ L))
                if no_residual:
                    # the limit of the fit as the residual variance goes to 0: the one-way
                    # analysis of the passage values on pole
                    wp = pd.Series(w, index=cells["pole"]).groupby(level=0).sum()
                    est = float((wp * pole_mean[wp.index]).sum())
                    se = float(np.sqrt(s2_between * (wp**2 / pole_n[wp.index]).sum()))
                try:
                    df = (
                        float(len(g) - len(names))
                        if all_zero
                        else between_df
                        if no_residual
                        else fit.satterthwaite_df(L)
                    )
                except np.linalg.LinAlgError:
                    df = float(len(g) - len(names))
                half = float(stats.t.ppf(zcrit_p, df) * se)
                # a zero or undefined SE has no test: p is NaN (the row is then not estimable)
                pval = float(2 * stats.t.sf(abs(est / se), df)) if se > 0 else np.nan
                row.update(
                    {
                        f"{eff}_est": est,
                        f"{eff}_se": se,
                        f"{eff}_df": df,
                        f"{eff}_ci_low": est - half,
                        f"{eff}_ci_high": est + half,
                        f"{eff}_p": pval,
                    }
                )
        else:
            msgs = ["missing pole x voice cell: effects not estimated", *msgs]
        inter = [i for i, n in enumerate(names) if ":" in n]
        R = np.zeros((len(inter), len(names)))
        for i, j in enumerate(inter):
            R[i, j] = 1.0
        b = R @ beta
        if no_residual:
            # content x voice is a within-passage contrast, and there is no within-passage variance to test it against
            inter = []
        try:
            if not inter:
                raise np.linalg.LinAlgError("no within-passage variance")
            chi2 = float(b @ np.linalg.solve(R @ cov @ R.T, b))
            den_df = float(len(g) - len(names)) if all_zero else f_test(fit, R)["den_df"]
            f_stat = chi2 / len(inter)
            row.update(
                chi2_interaction=chi2,
                df=len(inter),
                f_interaction=f_stat,
                den_df_interaction=den_df,
                p_interaction=float(stats.f.sf(f_stat, len(inter), den_df)),
            )
        except np.linalg.LinAlgError:
            msgs = (
                [*msgs, "interaction not tested (no within-passage variance)"]
                if no_residual
                else ["singular covariance of the interaction terms", *msgs]
            )
        row["converged"] = converged
        row["warning"] = "; ".join(msgs)
        rows.append(row)
    for row in rows:
        row.update(_mixed_status(row))
    return pd.DataFrame(rows, columns=MIXED_COLUMNS)


MIXED_COLUMNS = [
    "system",
    "lang",
    "task",
    "task_group",
    "measure",
    "units",
    "n",
    *(f"{eff}_{f}" for eff in EFFECTS for f in EFFECT_FIELDS),
    "chi2_interaction",
    "df",
    "f_interaction",
    "den_df_interaction",
    "p_interaction",
    "converged",
    "warning",
    "random_effects",
    "voices_per_gender",
    *STATUS_COLUMNS,
]


def _mixed_status(row: dict) -> dict:
    """'ok' when the fit converged and both effects have a finite estimate, a positive SE and a p-value
    (reason: the fit's warning, if any); otherwise 'not estimable' with the warning as reason."""
    finite = all(np.isfinite(row[f"{eff}_{f}"]) for eff in EFFECTS for f in ("est", "se", "p")) and all(
        row[f"{eff}_se"] > 0 for eff in EFFECTS
    )
    if row["converged"] and finite:
        return {"status": OK, "reason": row["warning"]}
    return {"status": NOT_ESTIMABLE, "reason": row["warning"] or "the effects could not be estimated"}


def rq1_pooled(
    acoustic: pd.DataFrame, measure: str = "delta_composite", confidence: float = 0.95, pool_systems: bool = False
) -> pd.DataFrame:
    """The pooled stereotype-signed contrast per system and task group, with its CI.

    Outputs of the same voiced passage (one per task of the group) are averaged
    first, since they share one input; with `pool_systems` the cells of every
    system are pooled into one row per task group (system 'ALL'; the S2S paper's
    panel-wide pooled contrast) and each voiced passage's outputs are averaged over
    the systems too, since every system answers the same input recordings (a
    delta's input part is common to all of them; the systems are not independent
    replicates). Each language x input-voice cell gives a contrast, the mean of its
    misaligned voiced passages minus the mean of its neutral ones, times the
    predicted sign; the pooled contrast is the mean over the cells (n_cells; two per
    language).

    The independent unit is the passage: a neutral passage is voiced by both voices
    and enters the male-voice contrast with sign - and the female-voice one with
    sign +, so its passage effect cancels. Per language the estimate is therefore
    a sum over passages of weighted values (weights +-1 / (2 n_cell)), and its
    variance is the sum over poles of n x the sample variance of those per-passage
    sums (feminine passages: male voice; masculine passages: female voice; neutral
    passages: the female minus male difference); the languages are averaged, their
    variances summed over the squared number of languages, with Welch-Satterthwaite
    degrees of freedom from the pole components. A language enters when each of its
    four cells (two misaligned, two neutral) has at least two voiced passages;
    n_voiced_passages counts the voiced passages used (system means when pooled) and
    n_systems the systems pooled. status is 'not estimable' (reason says why) when
    no language enters or the contrast has no variance.
    """
    d = _ok(acoustic, measure).copy()
    d["task_group"] = d["task"].map(task_group)
    keys = ["task_group", "lang", "voice_gender", "pole", "passage_id", "stimulus_id"]
    per_task = d.groupby(["system", *keys])[measure].mean().reset_index()
    if pool_systems:
        per_passage = per_task.groupby(keys)[measure].agg(["mean", "size"]).reset_index()
        per_passage = per_passage.rename(columns={"mean": measure, "size": "n_systems"}).assign(system="ALL")
        n_sys = per_task.groupby("task_group")["system"].nunique()
    else:
        per_passage = per_task
        n_sys = None
    rows = []
    for (system, group), g in per_passage.groupby(["system", "task_group"]):
        ests, variances, parts, n_units, n_cells = [], [], [], 0, 0
        for _, c in g.groupby("lang"):
            weight = np.zeros(len(c))
            sizes = {}
            for voice, pole in (
                ("male", MISALIGNED["male"]),
                ("male", "neutral"),
                ("female", MISALIGNED["female"]),
                ("female", "neutral"),
            ):
                sel = ((c["voice_gender"] == voice) & (c["pole"] == pole)).to_numpy()
                sizes[(voice, pole)] = int(sel.sum())
                sign = PREDICTED_SIGN[voice] * (1.0 if pole == MISALIGNED[voice] else -1.0)
                weight[sel] = sign / (2 * max(int(sel.sum()), 1))
            if min(sizes.values()) < 2:
                continue
            per_p = c.assign(w=weight * c[measure].to_numpy(float)).groupby(["pole", "passage_id"])["w"].sum()
            est, var = float(per_p.sum()), 0.0
            for _, v in per_p.groupby(level="pole"):
                if (v != 0).any():
                    part = len(v) * float(np.var(v.to_numpy(), ddof=1)) if len(v) > 1 else np.nan
                    var += part
                    parts.append((part, len(v) - 1))
            ests.append(est)
            variances.append(var)
            n_units += sum(sizes.values())
            n_cells += 2
        if not ests:
            rows.append(
                {
                    "system": system,
                    "task_group": group,
                    "measure": measure,
                    "n_cells": 0,
                    "n_systems": int(n_sys[group]) if n_sys is not None else 1,
                    "n_voiced_passages": 0,
                    "pooled_contrast": np.nan,
                    "se": np.nan,
                    "df": np.nan,
                    "ci_low": np.nan,
                    "ci_high": np.nan,
                    "p_value": np.nan,
                    "status": NOT_ESTIMABLE,
                    "reason": "no language has 2 or more voiced passages in each of its misaligned and "
                    "neutral cells (both voices)",
                }
            )
            continue
        k = len(ests)
        est = float(np.mean(ests))
        var = float(np.sum(variances) / k**2)
        se = float(np.sqrt(var))
        denom = sum((v / k**2) ** 2 / df for v, df in parts if df > 0)
        df = float(var**2 / denom) if denom > 0 else np.nan
        half = float(stats.t.ppf(0.5 + confidence / 2, df) * se) if se > 0 else 0.0
        rows.append(
            {
                "system": system,
                "task_group": group,
                "measure": measure,
                "n_cells": n_cells,
                "n_systems": int(n_sys[group]) if n_sys is not None else 1,
                "n_voiced_passages": n_units,
                "pooled_contrast": est,
                "se": se,
                "df": df,
                "ci_low": est - half,
                "ci_high": est + half,
                "p_value": float(2 * stats.t.sf(abs(est / se), df)) if se > 0 and np.isfinite(df) else np.nan,
                **(
                    {"status": OK, "reason": ""}
                    if se > 0 and np.isfinite(df)
                    else {"status": NOT_ESTIMABLE, "reason": "no variance between passages: no test"}
                ),
            }
        )
    return pd.DataFrame(rows, columns=POOLED_COLUMNS)


POOLED_COLUMNS = [
    "system",
    "task_group",
    "measure",
    "n_cells",
    "n_systems",
    "n_voiced_passages",
    "pooled_contrast",
    "se",
    "df",
    "ci_low",
    "ci_high",
    "p_value",
    *STATUS_COLUMNS,
]


def rq1_significance_counts(contrasts: pd.DataFrame, mixed: pd.DataFrame, alpha: float = 0.05) -> pd.DataFrame:
    """How many RQ1 tests reach alpha, per system and measure, and in which direction.

    From `rq1_contrasts`: the misaligned task-cells (system x language x task x input
    voice) tested (status 'ok'), how many have Welch p < alpha, and of those how many move toward
    the stereotype (signed contrast > 0) or away. From `rq1_mixed_models`: the fits,
    how many have interaction p < alpha, and how many have a stereotype-signed effect
    with p < alpha toward or away. The S2S paper reports its RQ1 null this way
    ('4 of 44 closed-model misaligned task-cells, three toward the stereotype';
    '4/40 fits reach p < .05'); under no drift about alpha of the tests reach it.
    """
    rows = []
    keys = sorted(
        set(zip(contrasts.get("system", []), contrasts.get("measure", [])))
        | set(zip(mixed.get("system", []), mixed.get("measure", [])))
    )
    for system, measure in keys:
        c = (
            contrasts[(contrasts["system"] == system) & (contrasts["measure"] == measure)]
            if len(contrasts)
            else contrasts
        )
        m = mixed[(mixed["system"] == system) & (mixed["measure"] == measure)] if len(mixed) else mixed
        c = c[c["status"] == OK] if "status" in c else c  # the cells tested
        sig = c[c["p_value"] < alpha] if len(c) else c
        msig = m[m["stereotype_effect_p"] < alpha] if len(m) else m
        rows.append(
            {
                "system": system,
                "measure": measure,
                "alpha": alpha,
                "n_cells": int(len(c)),
                "n_cells_significant": int(len(sig)),
                "n_cells_toward": int((sig["signed_contrast"] > 0).sum()) if len(sig) else 0,
                "n_cells_away": int((sig["signed_contrast"] < 0).sum()) if len(sig) else 0,
                "n_fits": int(m["p_interaction"].notna().sum()) if len(m) else 0,
                "n_fits_interaction_significant": int((m["p_interaction"] < alpha).sum()) if len(m) else 0,
                "n_fits_stereotype_toward": int((msig["stereotype_effect_est"] > 0).sum()) if len(msig) else 0,
                "n_fits_stereotype_away": int((msig["stereotype_effect_est"] < 0).sum()) if len(msig) else 0,
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "system",
            "measure",
            "alpha",
            "n_cells",
            "n_cells_significant",
            "n_cells_toward",
            "n_cells_away",
            "n_fits",
            "n_fits_interaction_significant",
            "n_fits_stereotype_toward",
            "n_fits_stereotype_away",
        ],
    )


def rq1_tables(acoustic: pd.DataFrame, confidence: float = 0.95) -> dict[str, pd.DataFrame]:
    """Every RQ1 table, as the analysis stage writes it and `voicebias analyze rq1` prints it:
    mixed models and pooled contrasts of the composite and F0 deltas and, where the scoring made
    them, their text-controlled net_ versions; Welch contrasts of every delta_ and net_ measure
    (F0, formant index, each classifier margin, the composite); the significance counts."""
    measures = [m for m in ("delta_composite", "delta_f0_median_st") if m in acoustic]
    # the text-controlled versions (output - text-matched control), when the scoring stage made them
    measures += [m.replace("delta_", "net_", 1) for m in measures if m.replace("delta_", "net_", 1) in acoustic]
    every = [*measures, *sorted(c for c in acoustic.columns if c.startswith(("delta_", "net_")) and c not in measures)]
    tables = {
        "rq1_contrasts": pd.concat([rq1_contrasts(acoustic, m) for m in every], ignore_index=True),
        # the measures' mixed models are independent fits: one per core
        "rq1_mixed_models": pd.concat(
            map_processes(partial(rq1_mixed_models, acoustic, confidence=confidence), measures, failures="first"),
            ignore_index=True,
        ),
        # per system, and the whole panel pooled (system 'ALL', as the S2S paper's pooled contrast)
        "rq1_pooled": pd.concat(
            [rq1_pooled(acoustic, m, confidence, pool_systems=pool) for pool in (False, True) for m in measures],
            ignore_index=True,
        ),
    }
    tables["rq1_significance_counts"] = rq1_significance_counts(
        tables["rq1_contrasts"], tables["rq1_mixed_models"], 1 - confidence
    )
    return tables
