"""Statistics of the speech-continuation study (SC paper), as tidy DataFrames.

- success rate per system and the all-systems-succeeded filter;
- speaker similarity by system x phonation x gender (SC paper, Table 2);
- voice-quality preservation: REML linear mixed models with variance components
  on the honest unit of the design (voicebias.analysis.mixed), type-III F tests with
  Satterthwaite degrees of freedom and Tukey-adjusted contrasts (voicebias.analysis.emm)
  of continuation against prompt (`voice_quality_models`);
- beta regression of rescaled judge scores with prompt-clustered robust standard
  errors and non-significant interactions removed stepwise by robust Wald tests.
"""

from __future__ import annotations

import itertools
import re
import warnings
from typing import Any, Iterable

import numpy as np
import pandas as pd
from patsy import build_design_matrices
from scipy import stats

from voicebias.analysis.emm import tukey_p_value
from voicebias.analysis.mixed import RemlFit, _plain_term, fit_reml, type3_f_tests
from voicebias.analysis.rounding import is_constant, negligible
from voicebias.analysis.status import NOT_ESTIMABLE, OK, STATUS_COLUMNS, NotEstimable
from voicebias.contract import SC_MEASURES


def success_table(df: pd.DataFrame) -> pd.DataFrame:
    """Share of continuation calls that succeeded, per system.

    Parameters
    ----------
    df : DataFrame
        One row per continuation call: system, status ('ok' when it succeeded).

    Returns
    -------
    DataFrame
        system, n (calls), succeeded, success_rate.

    Examples
    --------
    >>> import pandas as pd
    >>> calls = pd.DataFrame({"system": ["a"] * 3 + ["b"] * 3, "stimulus_id": ["s1", "s2", "s3"] * 2,
    ...                       "status": ["ok", "ok", "ok", "ok", "error", "ok"],
    ...                       "phonation": ["modal"] * 6, "voice_gender": ["male", "female", "male"] * 2,
    ...                       "speaker_similarity": [0.9, 0.8, 0.7, 0.6, None, 0.5]})
    >>> print(success_table(calls).round(3).to_string(index=False))
    system  n  succeeded  success_rate
         a  3          3         1.000
         b  3          2         0.667
    """
    g = df.groupby("system")["status"]
    return (
        pd.DataFrame({"n": g.size(), "succeeded": g.apply(lambda s: int((s == "ok").sum()))})
        .assign(success_rate=lambda x: x["succeeded"] / x["n"])
        .reset_index()
    )


def all_systems_succeeded(df: pd.DataFrame, key: str = "stimulus_id") -> pd.DataFrame:
    """Rows of the inputs on which every system succeeded (the SC paper's comparison set).

    Parameters
    ----------
    df : DataFrame
        One row per call: system, status and the `key` column.
    key : str
        Column naming the input (one stimulus per value).

    Returns
    -------
    DataFrame
        The successful rows of `df` whose `key` every system answered successfully.

    Examples
    --------
    >>> import pandas as pd
    >>> calls = pd.DataFrame({"system": ["a"] * 3 + ["b"] * 3, "stimulus_id": ["s1", "s2", "s3"] * 2,
    ...                       "status": ["ok", "ok", "ok", "ok", "error", "ok"],
    ...                       "phonation": ["modal"] * 6, "voice_gender": ["male", "female", "male"] * 2,
    ...                       "speaker_similarity": [0.9, 0.8, 0.7, 0.6, None, 0.5]})
    >>> print(all_systems_succeeded(calls)[["system", "stimulus_id"]].to_string(index=False))
    system stimulus_id
         a          s1
         a          s3
         b          s1
         b          s3
    """
    systems = df["system"].nunique()
    ok = df[df["status"] == "ok"].groupby(key)["system"].nunique()
    keep = set(ok[ok == systems].index)
    return df[df[key].isin(keep) & (df["status"] == "ok")]


def similarity_table(df: pd.DataFrame, value: str = "speaker_similarity") -> pd.DataFrame:
    """Mean (SD, n) speaker similarity by system x phonation x voice gender.

    Parameters
    ----------
    df : DataFrame
        One row per continuation: system, phonation, voice_gender and `value`.
    value : str
        Column to summarise.

    Returns
    -------
    DataFrame
        system, phonation, voice_gender, mean, sd (NaN for a single row), n.

    Examples
    --------
    >>> import pandas as pd
    >>> calls = pd.DataFrame({"system": ["a"] * 3 + ["b"] * 3, "stimulus_id": ["s1", "s2", "s3"] * 2,
    ...                       "status": ["ok", "ok", "ok", "ok", "error", "ok"],
    ...                       "phonation": ["modal"] * 6, "voice_gender": ["male", "female", "male"] * 2,
    ...                       "speaker_similarity": [0.9, 0.8, 0.7, 0.6, None, 0.5]})
    >>> print(similarity_table(all_systems_succeeded(calls)).round(3).to_string(index=False))
    system phonation voice_gender  mean    sd  n
         a     modal         male  0.80 0.141  2
         b     modal         male  0.55 0.071  2
    """
    g = df.groupby(["system", "phonation", "voice_gender"])[value]
    return g.agg(mean="mean", sd="std", n="size").reset_index()


def _factor_terms(formula_rhs: str) -> list[str]:
    return [t.strip() for t in formula_rhs.split("+") if t.strip()]


def _factorial_formula(y: str, factors: list[str]) -> str:
    return f"{y} ~ " + ("*".join(f"C({f}, Sum)" for f in factors) if factors else "1")


def _paired(vq: pd.DataFrame, measure: str, key: str) -> pd.DataFrame:
    """Each continuation with its prompt's `measure` (each prompt measured once): the continuation
    rows with d = continuation - prompt."""
    prompts = vq[vq["source"] == "prompt"].dropna(subset=[measure]).drop_duplicates(key)
    cont = vq[vq["source"] == "continuation"].dropna(subset=[measure])
    pair = cont.merge(prompts[[key, measure]].rename(columns={measure: "_prompt"}), on=key, how="inner")
    pair["d"] = pair[measure] - pair["_prompt"]
    return pair


def continuation_differences(vq: pd.DataFrame, measure: str, key: str = "stimulus_id") -> pd.DataFrame:
    """Continuation minus prompt per stimulus and system, averaged to voice x system x phonation cells.

    Each prompt is measured once (rows with source 'prompt'); each system's
    continuation of that stimulus is paired with it, so a continuation enters once
    and the prompt it continues is its within-stimulus reference. Stimulus,
    recording and prompt effects cancel in the difference; the cell mean over
    prompts is the unit of the voice-level model (`voice_quality_models`).

    Parameters
    ----------
    vq : DataFrame
        One row per measured recording: `key`, source (prompt or continuation),
        system, voice_id, voice_gender, phonation and the `measure` column.
    measure : str
        Column to difference.
    key : str
        Column pairing a continuation with its prompt.

    Returns
    -------
    DataFrame
        system, voice_id, voice_gender, phonation, d (mean continuation - prompt)
        and n (pairs in the cell).

    Examples
    --------
    Four voices, two phonation conditions, two prompts each; the continuation keeps
    half of the breathy shift:

    >>> import pandas as pd
    >>> voices = {"m1": ("male", 1.0), "m2": ("male", 1.6), "f1": ("female", 2.0), "f2": ("female", 2.9)}
    >>> cells = [(v, ph, s) for v in voices for ph in ("modal", "breathy") for s in ("p1", "p2")]
    >>> rows = []
    >>> for i, (v, ph, s) in enumerate(cells):
    ...     g, level = voices[v]
    ...     shift = 2.0 if ph == "breathy" else 0.0
    ...     common = {"stimulus_id": f"{v}-{ph}-{s}", "voice_id": v, "voice_gender": g, "phonation": ph}
    ...     rows += [{**common, "source": "prompt", "system": "",
    ...               "h1_h2_db": level + shift + (i * 53 % 7 - 3) / 10 + i / 50},
    ...              {**common, "source": "continuation", "system": "sys",
    ...               "h1_h2_db": level + shift / 2 + (i * 37 % 11 - 5) / 10}]
    >>> vq = pd.DataFrame(rows)
    >>> print(continuation_differences(vq, "h1_h2_db").round(3).to_string(index=False))
    system voice_id voice_gender phonation     d  n
       sys       f1       female   breathy -1.41  2
       sys       f1       female     modal  0.03  2
       sys       f2       female   breathy -1.39  2
       sys       f2       female     modal -0.30  2
       sys       m1         male   breathy -1.10  2
       sys       m1         male     modal -0.21  2
       sys       m2         male   breathy -1.08  2
       sys       m2         male     modal  0.01  2
    """
    pair = _paired(vq, measure, key)
    return pair.groupby(["system", "voice_id", "voice_gender", "phonation"], as_index=False).agg(
        d=("d", "mean"), n=("d", "size")
    )


def voice_quality_models(
    vq: pd.DataFrame, measures: Iterable[str] = SC_MEASURES, min_df: float = 3.0, prompts_random: bool = True
) -> dict[str, pd.DataFrame]:
    """Voice-quality preservation per measure: REML mixed models on the honest unit, type-III F tests, Tukey contrasts.

    Design: prompts x voices (2 per gender) x phonation conditions; each stimulus is
    measured once as a prompt and once per continuation system. The continuation
    effect is modelled on d = continuation - prompt (`continuation_differences`),
    averaged over prompts to voice x system x phonation cells::

        d ~ system * voice_gender * phonation + (1 | voice) + (1 | voice:phonation) + (1 | voice:system)

    (voice:phonation and voice:system only with two or more systems; with one they
    are the residual). Terms on d are the source terms of the prompt/continuation
    factorial: the intercept is 'source' (continuation vs prompt), voice_gender on d
    is 'source:voice_gender', and so on. The prompts' own terms come from their cell
    means, ``y ~ voice_gender * phonation + (1 | voice)``. Voices are the replicated
    unit of every gender comparison, so the df are those of 4 voices, not of the
    hundreds of stimuli: REML (`fit_reml`: without the >= 0 bound on the components,
    so that balanced data give each stratum's exact F test), Satterthwaite df
    (lmerTest's method, `f_test`), and terms with fewer than `min_df` denominator df
    are reported as not testable, p empty.
    Prompt-to-prompt variation in the continuation shift is averaged within cells;
    with the same prompts in every cell it cancels from every term except the
    overall 'source' shift, whose test therefore generalises over voices, not prompts.
    Beside it, with a prompt_id column, the model over voices and prompts
    (model GENERALISING_MODEL, `_generalising_model`): every continuation a row, prompts
    and their interactions random, so prompt x system variation enters the system terms' error.

    Parameters
    ----------
    vq : DataFrame
        One row per measured recording (see `continuation_differences`) with a
        column per measure.
    measures : iterable of str
        Measures to model (one set of models each; absent measures are skipped).
    min_df : float
        Fewest denominator df for which a p-value is reported (`type3_f_tests`).
    prompts_random : bool
        Whether to fit the model over voices and prompts beside the cell-mean model (the
        pipeline always does; a study of the cell-mean model alone may skip it).

    Returns
    -------
    dict of DataFrame
        'type3': measure, model, term, f_value, num_df, den_df, p_value, testable,
        note, status ('ok' when the test was made, else 'not estimable' with the
        note as reason); 'contrasts': Tukey-adjusted pairwise contrasts of source
        (prompt and each system's continuation) within each voice_gender x phonation
        cell: voice_gender, phonation, factor, level_a, level_b, estimate (a - b), se,
        df, t, ci_low, ci_high (95 %, per contrast, t with the Satterthwaite df),
        p_tukey, testable, note, status ('ok' with an estimate and interval, the
        note saying why a p is withheld), reason; 'fits': measure, model, n_cells,
        n_obs, converged, variance components, status ('not estimable' when the
        model could not be fitted: no pairs, a constant measure, a rank-deficient
        design, too few voices, no convergence) and reason. Nothing here raises on
        such tables.

    Examples
    --------
    >>> import pandas as pd
    >>> voices = {"m1": ("male", 1.0), "m2": ("male", 1.6), "f1": ("female", 2.0), "f2": ("female", 2.9)}
    >>> cells = [(v, ph, s) for v in voices for ph in ("modal", "breathy") for s in ("p1", "p2")]
    >>> rows = []
    >>> for i, (v, ph, s) in enumerate(cells):
    ...     g, level = voices[v]
    ...     shift = 2.0 if ph == "breathy" else 0.0
    ...     common = {"stimulus_id": f"{v}-{ph}-{s}", "voice_id": v, "voice_gender": g, "phonation": ph}
    ...     rows += [{**common, "source": "prompt", "system": "",
    ...               "h1_h2_db": level + shift + (i * 53 % 7 - 3) / 10 + i / 50},
    ...              {**common, "source": "continuation", "system": "sys",
    ...               "h1_h2_db": level + shift / 2 + (i * 37 % 11 - 5) / 10}]
    >>> vq = pd.DataFrame(rows)
    >>> out = voice_quality_models(vq, measures=["h1_h2_db"], min_df=1.5)
    >>> t3 = out["type3"]
    >>> cols = ["term", "f_value", "num_df", "den_df", "p_value"]
    >>> print(t3[t3["model"] == "continuation - prompt"][cols].round(3).to_string(index=False))
                             term  f_value  num_df  den_df  p_value
                           source  193.250     1.0     2.0    0.005
              source:voice_gender    3.098     1.0     2.0    0.220
                 source:phonation  125.170     1.0     2.0    0.008
    source:voice_gender:phonation    1.862     1.0     2.0    0.306
    >>> cols = ["voice_gender", "phonation", "level_a", "level_b", "estimate", "df", "p_tukey"]
    >>> print(out["contrasts"][cols].round(3).to_string(index=False))
    voice_gender phonation level_a level_b  estimate    df  p_tukey
          female   breathy     sys  prompt    -1.400 3.997    0.000
          female     modal     sys  prompt    -0.135 3.997    0.246
            male   breathy     sys  prompt    -1.090 3.997    0.000
            male     modal     sys  prompt    -0.100 3.997    0.371
    >>> print(out["fits"][["model", "n_cells", "n_obs", "converged"]].to_string(index=False))
                                               model  n_cells  n_obs  converged
                               continuation - prompt        8     16       True
    continuation - prompt, voices and prompts random        0      0      False
                                              prompt        8     16       True
    >>> print(out["fits"]["reason"].iloc[1])
    no continuation paired with a measured prompt that names its prompt_id
    """
    t3, contrasts, fits = [], [], []

    def fit_row(m: str, model: str, cells: pd.DataFrame, fit: RemlFit | None, problem: str = "") -> dict:
        n = {"measure": m, "model": model, "n_cells": len(cells), "n_obs": int(cells["n"].sum())}
        if fit is None:
            return {
                **n,
                "converged": False,
                "variance_components": f"not estimable: {problem}",
                "status": NOT_ESTIMABLE,
                "reason": problem,
            }
        return {
            **n,
            "converged": fit.converged,
            "variance_components": "; ".join(f"{k}={v:.4g}" for k, v in fit.vcomp.items()),
            "status": OK if fit.converged else NOT_ESTIMABLE,
            "reason": "" if fit.converged else "the REML optimisation did not converge",
        }

    def fitted(formula: str, cells: pd.DataFrame, groups: dict, y: str) -> tuple[RemlFit | None, str]:
        if is_constant(cells[y].to_numpy(float)):
            return (
                None,
                f"no variance: {'continuation - prompt' if y == 'd' else 'the prompt measure'}"
                " is the same in every cell",
            )
        try:
            return fit_reml(formula, cells, groups), ""
        except (NotEstimable, np.linalg.LinAlgError) as exc:
            return None, f"{exc} ({cells['voice_id'].nunique()} voices)"

    for m in measures:
        cells = continuation_differences(vq, m)
        if cells.empty:
            fits.append(
                fit_row(m, "continuation - prompt", cells, None, "no continuation paired with a measured prompt")
            )
            continue
        systems = sorted(cells["system"].unique())
        factors = [f for f in ("system", "voice_gender", "phonation") if cells[f].nunique() > 1]
        groups = {"voice": cells["voice_id"]}
        if len(systems) > 1:
            groups["voice:phonation"] = cells["voice_id"] + ":" + cells["phonation"]
            groups["voice:system"] = cells["voice_id"] + ":" + cells["system"]
        fit, problem = fitted(_factorial_formula("d", factors), cells, groups, "d")
        if fit is not None:
            rename = {
                "Intercept": "source",
                **{t: "source:" + _plain_term(t) for t in fit.term_columns if t != "Intercept"},
            }
            try:
                t3.append(type3_f_tests(fit, min_df, rename).assign(measure=m, model="continuation - prompt"))
                contrasts.append(_source_contrasts(fit, cells, factors, systems, min_df).assign(measure=m))
            except np.linalg.LinAlgError as exc:  # a singular covariance of the fixed effects
                fit, problem = None, f"singular covariance of the fixed effects: {exc}"
        fits.append(fit_row(m, "continuation - prompt", cells, fit, problem))
        if prompts_random:
            t3_g, fit_g = _generalising_model(vq, m, min_df)
            t3 += t3_g
            fits.append(fit_g)
        pr = vq[(vq["source"] == "prompt")].dropna(subset=[m]).drop_duplicates("stimulus_id")
        pr = pr[pr["stimulus_id"].isin(vq.loc[vq["source"] == "continuation", "stimulus_id"])]
        pcells = pr.groupby(["voice_id", "voice_gender", "phonation"], as_index=False).agg(y=(m, "mean"), n=(m, "size"))
        pf = [f for f in ("voice_gender", "phonation") if pcells[f].nunique() > 1]
        if len(pcells) > (pcells[pf].drop_duplicates().shape[0] if pf else 1) + 1:
            pfit, problem = fitted(_factorial_formula("y", pf), pcells, {"voice": pcells["voice_id"]}, "y")
            if pfit is not None:
                try:
                    pt = type3_f_tests(pfit, min_df)
                    t3.append(pt[pt["term"] != "Intercept"].assign(measure=m, model="prompt"))
                except np.linalg.LinAlgError as exc:
                    pfit, problem = None, f"singular covariance of the fixed effects: {exc}"
            fits.append(fit_row(m, "prompt", pcells, pfit, problem))
    cols3 = ["measure", "model", "term", "f_value", "num_df", "den_df", "p_value", "testable", "note", *STATUS_COLUMNS]
    type3 = pd.concat(t3, ignore_index=True) if t3 else pd.DataFrame(columns=cols3)
    tested = type3["p_value"].notna() & np.isfinite(type3["f_value"].astype(float))
    type3["status"] = np.where(tested, OK, NOT_ESTIMABLE)
    type3["reason"] = np.where(
        tested, "", type3["note"].astype(str).where(type3["note"].astype(str) != "", "the F test is undefined")
    )
    return {
        "type3": type3[cols3],
        "contrasts": pd.concat(contrasts, ignore_index=True)
        if contrasts
        else pd.DataFrame(
            columns=[
                "voice_gender",
                "phonation",
                "factor",
                "level_a",
                "level_b",
                "estimate",
                "se",
                "df",
                "t",
                "ci_low",
                "ci_high",
                "p_tukey",
                "testable",
                "note",
                *STATUS_COLUMNS,
                "measure",
            ]
        ),
        "fits": pd.DataFrame(
            fits, columns=["measure", "model", "n_cells", "n_obs", "converged", "variance_components", *STATUS_COLUMNS]
        ),
    }


#: the model over voices and prompts (every continuation a row; see `_generalising_model`)
GENERALISING_MODEL = "continuation - prompt, voices and prompts random"


def prompt_differences(vq: pd.DataFrame, measure: str, key: str = "stimulus_id") -> pd.DataFrame:
    """Continuation minus prompt per stimulus and system, one row each (the rows that
    `continuation_differences` averages to cells; the unit of the model over voices and prompts).

    Parameters
    ----------
    vq : DataFrame
        One row per measured recording (see `continuation_differences`) with prompt_id.
    measure : str
        Column to difference.
    key : str
        Column pairing a continuation with its prompt.

    Returns
    -------
    DataFrame
        system, prompt_id, voice_id, voice_gender, phonation and d, ordered by system, voice,
        phonation and prompt.

    Examples
    --------
    >>> import pandas as pd
    >>> vq = pd.DataFrame({"stimulus_id": ["a", "a", "b", "b"], "prompt_id": ["p1", "p1", "p2", "p2"],
    ...                    "source": ["prompt", "continuation"] * 2, "system": [None, "s", None, "s"],
    ...                    "voice_id": "f1", "voice_gender": "female", "phonation": "breathy",
    ...                    "h1_h2_db": [4.0, 3.5, 5.0, 4.2]})
    >>> print(prompt_differences(vq, "h1_h2_db").round(2).to_string(index=False))
    system prompt_id voice_id voice_gender phonation    d
         s        p1       f1       female   breathy -0.5
         s        p2       f1       female   breathy -0.8
    """
    pair = _paired(vq, measure, key)
    cols = ["system", "prompt_id", "voice_id", "voice_gender", "phonation", "d"]
    return (
        pair[cols].sort_values(["system", "voice_id", "phonation", "prompt_id"], kind="stable").reset_index(drop=True)
    )


def _generalising_model(vq: pd.DataFrame, m: str, min_df: float) -> tuple[list[pd.DataFrame], dict]:
    """The voice-quality model that generalises over voices and prompts: every continuation a row,

        d ~ system * voice_gender * phonation + (1 | voice) + (1 | voice:phonation) + (1 | prompt)
            + (1 | prompt:phonation) [+ (1 | voice:system) + (1 | voice:phonation:system) + (1 | prompt:system)]

    (the bracket with two or more systems), REML bounded at 0 as lme4, type-III F tests with
    Satterthwaite df (lmerTest's). The prompt x system and voice x system variation enters the error of
    the system terms, so a system claim holds for prompts and voices like these, not only for these.
    Returns its type-III rows and its fits row."""
    rows = prompt_differences(vq, m) if "prompt_id" in vq.columns else pd.DataFrame()
    base = {"measure": m, "model": GENERALISING_MODEL, "n_cells": 0, "n_obs": int(len(rows))}

    def failed(reason: str) -> tuple[list[pd.DataFrame], dict]:
        return [], {
            **base,
            "converged": False,
            "variance_components": f"not estimable: {reason}",
            "status": NOT_ESTIMABLE,
            "reason": reason,
        }

    if rows.empty or rows["prompt_id"].isna().all():
        return failed("no continuation paired with a measured prompt that names its prompt_id")
    rows = rows.dropna(subset=["prompt_id"])
    base["n_cells"] = int(rows.groupby(["system", "voice_id", "phonation"]).ngroups)
    if is_constant(rows["d"].to_numpy(float)):
        return failed("no variance: continuation - prompt is the same in every row")
    factors = [f for f in ("system", "voice_gender", "phonation") if rows[f].nunique() > 1]
    v, p, ph, sy = (rows[c].astype(str) for c in ("voice_id", "prompt_id", "phonation", "system"))
    groups = {"voice": v, "voice:phonation": v + ":" + ph, "prompt": p, "prompt:phonation": p + ":" + ph}
    if rows["system"].nunique() > 1:
        groups.update(
            {
                "voice:system": v + ":" + sy,
                "voice:phonation:system": v + ":" + ph + ":" + sy,
                "prompt:system": p + ":" + sy,
            }
        )
    if rows["prompt_id"].nunique() < 2:
        return failed("one prompt only: no prompt variance to generalise over")
    try:
        fit = fit_reml(_factorial_formula("d", factors), rows, groups, nobound=False)
    except (NotEstimable, np.linalg.LinAlgError) as exc:
        return failed(f"{exc} ({rows['voice_id'].nunique()} voices, {rows['prompt_id'].nunique()} prompts)")
    per_gender = rows.groupby("voice_gender")["voice_id"].nunique()
    units = f"{int(per_gender.min())} voices per gender, {rows['prompt_id'].nunique()} prompts"
    rename = {"Intercept": "source", **{t: "source:" + _plain_term(t) for t in fit.term_columns if t != "Intercept"}}
    try:
        t3 = type3_f_tests(fit, min_df, rename, units=units).assign(measure=m, model=GENERALISING_MODEL)
    except np.linalg.LinAlgError as exc:
        return failed(f"singular covariance of the fixed effects: {exc}")
    return [t3], {
        **base,
        "converged": fit.converged,
        "variance_components": "; ".join(f"{k}={val:.4g}" for k, val in fit.vcomp.items()),
        "status": OK if fit.converged else NOT_ESTIMABLE,
        "reason": "" if fit.converged else "the REML optimisation did not converge",
    }


def _source_contrasts(
    fit: RemlFit, cells: pd.DataFrame, factors: list[str], systems: list[str], min_df: float
) -> pd.DataFrame:
    """Pairwise contrasts of prompt and each system's continuation within voice_gender x phonation cells.

    On the d scale the prompt is 0, system k's continuation is the cell's fitted d;
    the family of each cell has len(systems) + 1 levels (Tukey over them, each
    contrast with its Satterthwaite df)."""
    genders = sorted(cells["voice_gender"].unique())
    phons = sorted(cells["phonation"].unique())
    grid = pd.DataFrame(
        list(itertools.product(systems, genders, phons)), columns=["system", "voice_gender", "phonation"]
    )
    Xg = np.asarray(build_design_matrices([fit.design_info], grid)[0])
    beta = fit.params.to_numpy()
    k = len(systems) + 1
    rows = []
    for g, p in itertools.product(genders, phons):
        x = {
            s: Xg[((grid["system"] == s) & (grid["voice_gender"] == g) & (grid["phonation"] == p)).to_numpy()][0]
            for s in systems
        }
        pairs = [(s, "prompt", x[s]) for s in systems] + [
            (a, b, x[a] - x[b]) for a, b in itertools.combinations(systems, 2)
        ]
        for a, b, c in pairs:
            est = float(c @ beta)
            se = float(np.sqrt(c @ fit.C @ c))
            df = fit.satterthwaite_df(c)
            t = est / se if se > 0 else np.nan
            ok = bool(df >= min_df)  # False for NaN (no df: degenerate fit)
            half = float(stats.t.isf(0.025, df)) * se if np.isfinite(df) else float(stats.norm.isf(0.025)) * se
            note = (
                ""
                if ok
                else (
                    f"not testable: {df:.1f} df (< {min_df:g}); 2 voices per gender"
                    if np.isfinite(df)
                    else "not testable: no df (degenerate fit)"
                )
            )
            # an estimate with its interval is 'ok' even where the test is withheld (note says why)
            estimated = bool(np.isfinite(est) and se > 0 and np.isfinite(est - half) and np.isfinite(est + half))
            rows.append(
                {
                    "voice_gender": g,
                    "phonation": p,
                    "factor": "source",
                    "level_a": a,
                    "level_b": b,
                    "estimate": est,
                    "se": se,
                    "df": df,
                    "t": t,
                    "ci_low": est - half,
                    "ci_high": est + half,
                    "p_tukey": tukey_p_value(t, k, df) if ok else np.nan,
                    "testable": ok,
                    "note": note,
                    "status": OK if estimated else NOT_ESTIMABLE,
                    "reason": note if estimated else "no variance: the contrast has no standard error",
                }
            )
    return pd.DataFrame(rows)


JUDGE_MIXED_MODEL = "logit judge score, voices and prompts random"


def judge_mixed_model(df: pd.DataFrame, dimension: str, min_df: float = 3.0) -> tuple[pd.DataFrame, dict]:
    """The judge scores with voices and prompts as random effects: every judged continuation a row,

        logit(y) ~ system * voice_gender * phonation + (1 | voice) + (1 | voice:phonation) + (1 | prompt)
                   + (1 | prompt:phonation) [+ (1 | voice:system) + (1 | voice:phonation:system) + (1 | prompt:system)]

    with y the score rescaled into (0, 1) (`rescale_scores`) and the bracket with two or more
    systems; REML bounded at 0 as lme4, type-III F tests with Satterthwaite df (lmerTest's). The
    beta regression (`beta_regression_stepwise`) is the SC paper's analysis and clusters by
    prompt only, so it cannot test a term that varies between voices; this linear mixed model on
    the logit scale takes each voice's offset and its phonation profile as random, so the gender
    terms are tested on the voices (with 3 or more per gender) and the conclusions hold for voices
    and prompts like these. Under simulated nulls (beta-distributed scores, voice and prompt SD 0.3
    and voice x phonation SD 0.1 on the logit scale, 30 prompts) it rejects the gender term and the
    gender x phonation term at .05 in at most 8 % of datasets with 3 and 6 voices per gender
    (docs/analysis.md, "SC judge: the model over voices and prompts").

    Parameters
    ----------
    df : DataFrame
        Judged continuations: `dimension` (the score), system, voice_gender, voice_id, phonation,
        prompt_id.
    dimension : str
        The judge dimension (score column) to model.
    min_df : float
        Fewest denominator df for which a p-value is reported (`type3_f_tests`).

    Returns
    -------
    tuple of (DataFrame, dict)
        The type-III rows (term, f_value, num_df, den_df, p_value, testable, note, dimension,
        model, status, reason; a term with too few denominator df is 'not estimable', its note
        says why) and the fit's row (dimension, model, n, converged, variance_components,
        generalises_over, status, reason).

    Raises
    ------
    NotEstimable
        When the data cannot support the model: constant scores, a table without prompt_id or
        voice_id, one prompt or one voice only, a fit that fails.

    Examples
    --------
    Four voices per gender, six prompts, scores that follow the voice gender:

    >>> import numpy as np, pandas as pd
    >>> rng = np.random.default_rng(1)
    >>> rows = [{"system": "s", "voice_gender": g, "voice_id": f"{g}{v}", "phonation": ph, "prompt_id": f"p{p}",
    ...          "agency": float(np.clip(np.round(3 + (0.8 if g == "male" else -0.8) + rng.normal(0, 0.6)), 1, 5))}
    ...         for g in ("male", "female") for v in range(4) for ph in ("modal", "breathy") for p in range(6)]
    >>> t3, fit = judge_mixed_model(pd.DataFrame(rows), "agency")
    >>> bool(t3.set_index("term").loc["voice_gender", "p_value"] < 0.05), fit["status"]
    (True, 'ok')
    """
    missing = [c for c in ("prompt_id", "voice_id") if c not in df.columns]
    if missing:
        raise NotEstimable(f"no {' or '.join(missing)} column: no voices or prompts to generalise over")
    rows = df.dropna(subset=[dimension, "prompt_id", "voice_id"]).copy()
    if rows[dimension].nunique() < 2:
        raise NotEstimable(f"constant scores: {dimension} takes {rows[dimension].nunique()} value(s)")
    if rows["prompt_id"].nunique() < 2 or rows["voice_id"].nunique() < 2:
        raise NotEstimable(
            f"{rows['prompt_id'].nunique()} prompt(s), {rows['voice_id'].nunique()} voice(s): "
            "nothing to generalise over"
        )
    y = rescale_scores(rows[dimension].astype(float))
    rows["d"] = np.log(y / (1 - y))
    factors = [f for f in ("system", "voice_gender", "phonation") if f in rows and rows[f].nunique() > 1]
    v, p = rows["voice_id"].astype(str), rows["prompt_id"].astype(str)
    ph = rows["phonation"].astype(str) if "phonation" in rows else pd.Series("", index=rows.index)
    groups = {"voice": v, "prompt": p}
    if "phonation" in factors:
        groups.update({"voice:phonation": v + ":" + ph, "prompt:phonation": p + ":" + ph})
    if "system" in factors:
        sy = rows["system"].astype(str)
        groups.update({"voice:system": v + ":" + sy, "prompt:system": p + ":" + sy})
        if "phonation" in factors:
            groups["voice:phonation:system"] = v + ":" + ph + ":" + sy
    try:
        fit = fit_reml(_factorial_formula("d", factors), rows, groups, nobound=False)
    except np.linalg.LinAlgError as exc:
        raise NotEstimable(f"the mixed model failed: {exc}") from None
    per_gender = rows.groupby("voice_gender")["voice_id"].nunique()
    units = f"{int(per_gender.min())} voices per gender, {rows['prompt_id'].nunique()} prompts"
    rename = {t: _plain_term(t) for t in fit.term_columns}
    t3 = type3_f_tests(fit, min_df, rename, units=units)
    t3 = t3[t3["term"] != "Intercept"].assign(dimension=dimension, model=JUDGE_MIXED_MODEL).reset_index(drop=True)
    # a term along which the scores do not vary at all (a continuation text shared by a prompt's
    # phonation conditions) has F at rounding level: no test, as in the beta regression
    flat = np.array([negligible(abs(float(f)), 1.0) for f in t3["f_value"]], dtype=bool)
    t3.loc[flat, ["p_value"]] = np.nan
    t3.loc[flat, "testable"] = False
    t3.loc[flat, "note"] = "not testable: the scores do not vary along this term (F at rounding level)"
    tested = t3["p_value"].notna() & np.isfinite(t3["f_value"].astype(float))
    t3["status"] = np.where(tested, OK, NOT_ESTIMABLE)
    t3["reason"] = np.where(
        tested, "", t3["note"].astype(str).where(t3["note"].astype(str) != "", "the F test is undefined")
    )
    return t3, {
        "dimension": dimension,
        "model": JUDGE_MIXED_MODEL,
        "n": int(len(rows)),
        "converged": fit.converged,
        "variance_components": "; ".join(f"{k}={val:.4g}" for k, val in fit.vcomp.items()),
        "generalises_over": units + " (random)",
        "status": OK if fit.converged else NOT_ESTIMABLE,
        "reason": "" if fit.converged else "the REML optimisation did not converge",
    }


def rescale_scores(scores: pd.Series, low: float = 1.0, high: float = 5.0) -> pd.Series:
    """Map bounded scores into (0, 1) for beta regression (Smithson & Verkuilen, 2006):
    y' = ((y - low) / (high - low) * (n - 1) + 0.5) / n.

    Parameters
    ----------
    scores : Series
        Scores on [low, high]; n counts the non-missing ones.
    low, high : float
        Bounds of the score scale.

    Returns
    -------
    Series
        The rescaled scores, strictly inside (0, 1).

    Examples
    --------
    >>> import pandas as pd
    >>> rescale_scores(pd.Series([1.0, 3.0, 5.0, 5.0])).tolist()
    [0.125, 0.5, 0.875, 0.875]
    """
    n = scores.notna().sum()
    return ((scores - low) / (high - low) * (n - 1) + 0.5) / n


def _terms_formula(y: str, terms: list[frozenset]) -> str:
    parts = [":".join(f"C({f}, Sum)" for f in sorted(t)) for t in sorted(terms, key=lambda t: (len(t), sorted(t)))]
    return f"{y} ~ " + (" + ".join(parts) if parts else "1")


def _fit_beta(formula: str, data: pd.DataFrame, cluster: str | None = None):
    """The BetaModel fit of `formula`; NotEstimable when the design is rank deficient (an empty
    cell of the factorial), the optimiser does not converge or the covariance is not finite."""
    from statsmodels.othermod.betareg import BetaModel

    kw: dict[str, Any] = {}
    if cluster is not None:
        kw = {"cov_type": "cluster", "cov_kwds": {"groups": pd.factorize(data[cluster])[0]}}
    model = BetaModel.from_formula(formula, data)
    X = np.asarray(model.exog, float)
    if np.linalg.matrix_rank(X) < X.shape[1]:
        raise NotEstimable(f"singular design: '{formula}' is rank deficient (an empty cell of the factorial)")
    if X.shape[0] <= X.shape[1] + 1:
        raise NotEstimable(f"{X.shape[0]} observations for {X.shape[1] + 1} parameters")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = model.fit(disp=0, maxiter=500, **kw)
    if not fit.mle_retvals.get("converged", True):
        raise NotEstimable(f"the beta regression '{formula}' did not converge")
    if not (np.all(np.isfinite(fit.params)) and np.all(np.isfinite(fit.bse)) and np.isfinite(fit.llf)):
        raise NotEstimable(f"the beta regression '{formula}' has no finite estimate or covariance")
    return fit


def _term_of(name: str) -> str:
    return ":".join(re.sub(r"C\((\w+), Sum\)(\[.*?\])?$", r"\1", part) for part in name.split(":"))


def beta_regression_stepwise(
    df: pd.DataFrame,
    y: str,
    factors: Iterable[str],
    alpha: float = 0.05,
    cluster: str | None = None,
    between_unit_factors: Iterable[str] = (),
) -> dict[str, pd.DataFrame]:
    """Beta regression of y (in (0, 1)) on the full factorial of `factors`, then stepwise removal.

    Maximum likelihood with a logit mean and log precision (statsmodels BetaModel).
    Observations that share a `cluster` (the prompt: every voice, condition and
    system continues the same text) are not independent, and a beta regression with
    a random effect is not available, so with `cluster` the standard errors are
    cluster-robust (sandwich over clusters, statsmodels' small-sample factor
    G/(G-1) (N-1)/(N-K)) and every test is a robust Wald test referred to F(q, G - 1)
    (t with G - 1 df for one coefficient); without it, model-based SEs and Wald
    chi-square tests. At each step every interaction not contained in a
    higher-order remaining term is tested; the least significant one with p > alpha
    is dropped; main effects are kept. Terms containing a `between_unit_factors`
    factor (voice_gender: it varies between voices, and there is no voice random effect here) are
    not tested: they stay in the model, their p is empty and `note` says why (`judge_mixed_model`
    tests them on the voices).

    Parameters
    ----------
    df : DataFrame
        One row per judged continuation: y, the `factors` and `cluster`.
    y : str
        Outcome column, in (0, 1) (`rescale_scores`).
    factors : iterable of str
        Factors of the full factorial.
    alpha : float
        Interactions with p above it are removed; an interaction along which the scores do
        not vary at all (coefficients and SEs at rounding level) is removed first, with an
        empty stat and p. Such a coefficient in the final model is reported not testable
        (p empty), as are the terms of `between_unit_factors`.
    cluster : str, optional
        Column whose values group dependent observations.
    between_unit_factors : iterable of str
        Factors whose terms are kept untested.

    Returns
    -------
    dict of DataFrame
        'steps' (removed, stat, df, den_df, p_value), 'coefficients' (term, estimate,
        se, p_value, testable, note), 'kept_interactions' (term, testable), 'llf'.

    Raises
    ------
    NotEstimable
        When the data cannot support the model: a constant outcome, fewer than 2
        clusters, a rank-deficient design (an empty cell of the factorial), a fit that
        does not converge or has no finite covariance. Any other error is a fault.

    Examples
    --------
    Eight prompts, each continued in every gender x phonation cell, with additive
    gender and phonation effects (a small interaction on half the prompts): the interaction is
    removed, the main effects kept.

    >>> import pandas as pd
    >>> prompt_effect = [0.3, -0.2, 0.1, -0.4, 0.2, 0.0, -0.1, 0.4]
    >>> rows = [{"prompt": f"p{i}", "voice_gender": g, "phonation": ph,
    ...          "score": 3 + (0.8 if g == "male" else -0.4) + (-0.5 if ph == "creaky" else 0.3) + prompt_effect[i]
    ...          + (0.2 if (g, ph) == ("male", "creaky") else 0.0) * (i % 2)}
    ...         for i in range(8) for g in ("male", "female") for ph in ("modal", "creaky")]
    >>> d = pd.DataFrame(rows).assign(y=lambda x: rescale_scores(x["score"]))
    >>> res = beta_regression_stepwise(d, "y", ["phonation", "voice_gender"], cluster="prompt")
    >>> print(res["steps"].round(3).to_string(index=False))
                   removed  stat  df  den_df  p_value
    phonation:voice_gender 0.033   1     7.0    0.861
    >>> print(res["coefficients"][["term", "estimate", "se", "p_value"]].round(3).to_string(index=False))
                              term  estimate    se  p_value
                         Intercept     0.181 0.108    0.136
       C(phonation, Sum)[S.creaky]    -0.412 0.011    0.000
    C(voice_gender, Sum)[S.female]    -0.657 0.010    0.000
                         precision     4.068 0.404    0.000
    >>> len(res["kept_interactions"])
    0

    With voice_gender between units, its terms stay in the model untested:

    >>> res = beta_regression_stepwise(d, "y", ["phonation", "voice_gender"], cluster="prompt",
    ...                                between_unit_factors=["voice_gender"])
    >>> print(res["kept_interactions"].to_string(index=False))
                      term  testable
    phonation:voice_gender     False
    """
    factors = list(factors)
    between = set(between_unit_factors)
    terms = [frozenset(c) for r in range(1, len(factors) + 1) for c in itertools.combinations(factors, r)]
    steps = []
    if df[y].nunique() < 2:
        raise NotEstimable(f"degenerate outcome: {y} takes {df[y].nunique()} value(s)")
    n_clusters = int(df[cluster].nunique()) if cluster is not None else None
    if n_clusters is not None and n_clusters < 2:
        raise NotEstimable(f"cluster-robust SEs need at least 2 clusters of '{cluster}', got {n_clusters}")
    fit = _fit_beta(_terms_formula(y, terms), df, cluster)

    def no_variation(b: np.ndarray, v: np.ndarray) -> bool:
        # logit-scale coefficients and SEs below 1e-7 (voicebias.analysis.rounding): real data give SEs
        # of 1e-3 and more; an outcome that does not vary along a term gives 1e-15
        return all(negligible(x, 1.0) for x in (*b, *np.sqrt(np.abs(np.diag(v)))))

    def wald(f, t: frozenset) -> tuple[float, int, float]:
        names = list(f.params.index)
        idx = [
            i
            for i, n in enumerate(names)
            if n != "precision" and n != "Intercept" and frozenset(_term_of(n).split(":")) == t
        ]
        b = f.params.to_numpy()[idx]
        v = f.cov_params().to_numpy()[np.ix_(idx, idx)]
        if no_variation(b, v):
            # the scores do not vary along the term: coefficients and SEs are rounding, and a
            # Wald statistic of rounding over rounding is anything; the term goes first, untested
            return np.nan, len(idx), np.nan
        if np.linalg.matrix_rank(v) < len(idx):  # e.g. a cluster-robust covariance from fewer clusters than terms
            raise NotEstimable(f"the covariance of {':'.join(sorted(t))} is singular ({n_clusters} clusters)")
        stat = float(b @ np.linalg.solve(v, b))
        if n_clusters is None:
            return stat, len(idx), float(stats.chi2.sf(stat, len(idx)))
        return stat / len(idx), len(idx), float(stats.f.sf(stat / len(idx), len(idx), n_clusters - 1))

    while True:
        candidates = [t for t in terms if len(t) > 1 and not any(t < u for u in terms) and not (t & between)]
        tests = [(*wald(fit, t), t) for t in candidates]
        removable = [x for x in tests if np.isnan(x[2]) or x[2] > alpha]
        if not removable:
            break
        stat, ddf, p, t = max(removable, key=lambda x: np.inf if np.isnan(x[2]) else x[2])
        steps.append(
            {
                "removed": ":".join(sorted(t)),
                "stat": stat,
                "df": ddf,
                "den_df": float(n_clusters - 1) if n_clusters else np.inf,
                "p_value": p,
            }
        )
        terms = [u for u in terms if u != t]
        fit = _fit_beta(_terms_formula(y, terms), df, cluster)
    names = list(fit.params.index)
    se = fit.bse.to_numpy()
    z = fit.params.to_numpy() / se
    p = 2 * (stats.t.sf(np.abs(z), n_clusters - 1) if n_clusters else stats.norm.sf(np.abs(z)))
    between_note = (
        "not testable: voice_gender varies between voices and the beta regression has no voice effect "
        "(the model over voices and prompts tests it: judge_mixed_type3.csv)"
    )
    flat_note = "not testable: the scores do not vary along this term (estimate and SE are rounding)"
    notes = []
    for n, b, s in zip(names, fit.params.to_numpy(), se):
        if n not in ("Intercept", "precision") and bool(set(_term_of(n).split(":")) & between):
            notes.append(between_note)
        elif n not in ("Intercept", "precision") and no_variation(np.array([b]), np.array([[s * s]])):
            notes.append(flat_note)
        else:
            notes.append("")
    coefs = pd.DataFrame(
        {
            "term": names,
            "estimate": fit.params.to_numpy(),
            "se": se,
            "p_value": np.where([bool(x) for x in notes], np.nan, p),
            "testable": [not x for x in notes],
            "note": notes,
        }
    )
    kept = [t for t in terms if len(t) > 1]
    return {
        "steps": pd.DataFrame(steps, columns=["removed", "stat", "df", "den_df", "p_value"]),
        "coefficients": coefs,
        "kept_interactions": pd.DataFrame(
            {"term": [":".join(sorted(t)) for t in kept], "testable": [not (t & between) for t in kept]}
        ),
        "llf": pd.DataFrame([{"llf": fit.llf}]),
    }
