"""Stage 'sc_analysis' of the speech-continuation (SC) study.

All continuation systems together (voicebias.analysis.sc_stats): success rates and the
all-systems-succeeded set, speaker similarity by system x phonation x gender (SC
paper Table 2), voice-quality preservation (REML mixed model per measure on
continuation - prompt, voice-level random effects, type-III F tests with
Satterthwaite df, Tukey contrasts of prompt vs each continuation; terms the 2 voices
per gender cannot test are marked), retention of the prompt's phonation change, judge
scores by system x phonation x gender (SC paper Fig. 2) with stepwise beta regression
(prompt-clustered robust SEs), and planted vs recovered values for reference systems.

The other SC stages: voicebias.pipeline.sc_continue (the continuations), voicebias.scoring.continuation
(the scored table this module reads). Every analysis reads tables only, so
`voicebias analyze sc ...` re-runs it on shared outputs without calling any system.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np
import pandas as pd

from voicebias.analysis.intervals import wilson
from voicebias.analysis.planted import PLANTED_HEAD, SIMULTANEOUS_COLUMNS, wilson_interval, with_simultaneous
from voicebias.analysis.status import NOT_ESTIMABLE, OK, STATUS_COLUMNS, NotEstimable
from voicebias.blas import single_blas_thread
from voicebias.contract import CONDITIONS, GENDERS, H1_H2, SC_MEASURES

#: |recovered - planted| within which a planted retention counts as recovered (see planted_vs_recovered)
RETENTION_TOLERANCE = 0.05


def prompt_vq_rows(prompt_measures: pd.DataFrame) -> pd.DataFrame:
    """Prompt voice-quality rows from the manipulation check's measures: one per stimulus
    (source 'prompt', system empty: a prompt is measured once, whatever continues it)."""
    ok = prompt_measures[prompt_measures["measure_status"] == "ok"]
    return pd.DataFrame(
        {
            "stimulus_id": ok["stimulus_id"],
            "prompt_id": ok["prompt_id"],
            "voice_gender": ok["voice_gender"],
            "voice_id": ok["voice_id"],
            "phonation": ok["phonation"],
            **{m: ok[f"{m}_whole"] for m in SC_MEASURES},
            "source": "prompt",
            "system": np.nan,
        }
    ).drop_duplicates("stimulus_id")


def vq_long(scored: pd.DataFrame, prompt_measures: pd.DataFrame) -> pd.DataFrame:
    """Prompt and continuation voice quality in one table (columns source, system, ...):
    each prompt once (system NaN) for the stimuli some system continued, each
    continuation once with its system."""
    cont = scored[(scored["status"] == "ok") & (scored["measure_status"] == "ok")]
    cont = cont[["stimulus_id", "prompt_id", "voice_gender", "voice_id", "phonation", "system", *SC_MEASURES]].assign(
        source="continuation"
    )
    prompts = prompt_vq_rows(prompt_measures)
    prompts = prompts[prompts["stimulus_id"].isin(cont["stimulus_id"])]
    return pd.concat([prompts, cont], ignore_index=True)


def per_system_view(vq: pd.DataFrame) -> pd.DataFrame:
    """For descriptive tables and figures only: each system's continuations beside the
    prompts of the stimuli it continued (prompt rows repeated per system, system set)."""
    prompts = vq[vq["source"] == "prompt"]
    cont = vq[vq["source"] == "continuation"]
    parts = [cont]
    for s, c in cont.groupby("system"):
        parts.append(prompts[prompts["stimulus_id"].isin(c["stimulus_id"])].assign(system=s))
    return pd.concat(parts, ignore_index=True)


def retention(
    vq: pd.DataFrame, measures: Iterable[str] = SC_MEASURES, n_boot: int = 500, seed: int = 0, confidence: float = 0.95
) -> pd.DataFrame:
    """Share of the prompt's phonation change that the continuation keeps, per system x gender x measure.

    For each non-modal condition c, d_src(c) = mean(source, c) - mean(source, modal);
    retention is the least-squares slope through the origin of d_continuation on
    d_prompt over the conditions: sum d_p d_c / sum d_p^2 (1 = kept, 0 = back to
    modal). CI: percentile bootstrap over prompts (prompt_id clusters). The CI is
    conditional on the voices (2 per gender, too few to resample): it says how well
    these voices' retention is measured, not how it varies over voices. Prompt rows
    without a system (`vq_long`) are paired with each system's continuations. status is
    'not estimable' (reason says why) without modal or non-modal conditions, when the
    prompts' change is 0, or with fewer than 2 prompts (no interval).
    """
    rng = np.random.default_rng(seed)

    def slope(d: pd.DataFrame, m: str) -> float:
        means = d.groupby(["source", "phonation"])[m].mean()
        if ("prompt", "modal") not in means or ("continuation", "modal") not in means:
            return float("nan")  # no modal reference to measure a change from
        num = den = 0.0
        for c in d["phonation"].unique():
            if c == "modal" or ("prompt", c) not in means or ("continuation", c) not in means:
                continue
            dp = means[("prompt", c)] - means[("prompt", "modal")]
            dc = means[("continuation", c)] - means[("continuation", "modal")]
            num += dp * dc
            den += dp * dp
        return num / den if den > 0 else float("nan")

    rows = []
    if vq["system"].isna().any():
        vq = per_system_view(vq)
    for (system, gender), d in vq.groupby(["system", "voice_gender"], sort=True):
        prompts = d["prompt_id"].unique()
        groups = {p: g for p, g in d.groupby("prompt_id")}
        boots = {m: [] for m in measures}
        for _ in range(n_boot):
            sample = pd.concat([groups[p] for p in rng.choice(prompts, size=len(prompts), replace=True)])
            for m in measures:
                boots[m].append(slope(sample, m))
        a = (1 - confidence) / 2
        for m in measures:
            b = np.asarray(boots[m], dtype=float)
            b = b[np.isfinite(b)]
            row = {
                "system": system,
                "voice_gender": gender,
                "measure": m,
                "retention": slope(d, m),
                "ci_low": float(np.quantile(b, a)) if b.size else np.nan,
                "ci_high": float(np.quantile(b, 1 - a)) if b.size else np.nan,
                "n_prompts": len(prompts),
            }
            rows.append({**row, **_retention_status(d, m, row)})
    return pd.DataFrame(
        rows,
        columns=["system", "voice_gender", "measure", "retention", "ci_low", "ci_high", "n_prompts", *STATUS_COLUMNS],
    )


def _retention_status(d: pd.DataFrame, m: str, row: dict) -> dict:
    """'ok' with a finite retention and bootstrap CI over 2 or more prompts; else 'not estimable' and why."""
    if row["n_prompts"] >= 2 and all(np.isfinite(row[k]) for k in ("retention", "ci_low", "ci_high")):
        return {"status": OK, "reason": ""}
    conds = set(d.loc[d[m].notna(), "phonation"])
    if "modal" not in conds:
        why = "no modal prompts or continuations: no reference for the phonation change"
    elif not conds - {"modal"}:
        why = "no non-modal condition: no phonation change to retain"
    elif not np.isfinite(row["retention"]):
        why = "the prompts' phonation change is 0: retention undefined"
    elif row["n_prompts"] < 2:
        why = "one prompt: no bootstrap interval"
    else:
        why = "no finite bootstrap interval"
    return {"status": NOT_ESTIMABLE, "reason": why}


def judge_score_table(scored: pd.DataFrame, dims: list[str]) -> pd.DataFrame:
    """Mean, SD and n of each judge dimension by system x phonation x voice gender (SC paper Fig. 2),
    plus an 'all' phonation row per system x gender (all conditions together)."""
    ok = scored[scored["judge_status"] == "ok"]
    long = ok.melt(
        id_vars=["system", "phonation", "voice_gender"], value_vars=dims, var_name="dimension", value_name="score"
    ).dropna(subset=["score"])
    long["score"] = long["score"].astype(float)
    by = (
        long.groupby(["system", "dimension", "phonation", "voice_gender"])["score"]
        .agg(mean="mean", sd="std", n="size")
        .reset_index()
    )
    allc = (
        long.groupby(["system", "dimension", "voice_gender"])["score"]
        .agg(mean="mean", sd="std", n="size")
        .reset_index()
        .assign(phonation="all")
    )
    return pd.concat([by, allc], ignore_index=True)[
        ["system", "dimension", "phonation", "voice_gender", "mean", "sd", "n"]
    ]


def judge_models(scored: pd.DataFrame, dims: list[str], alpha: float = 0.05) -> dict[str, pd.DataFrame]:
    """Stepwise beta regression of each rescaled judge dimension on phonation x gender x system (the
    SC paper's analysis), and beside it the model over voices and prompts (`judge_mixed_model`:
    'mixed' and 'mixed_fits').

    One row per judged continuation; the prompt (same text under every voice,
    condition and system) is the cluster of the robust SEs, and terms with
    voice_gender are estimated but not tested (gender varies between voices and the beta
    regression has no voice effect; see `sc_stats.beta_regression_stepwise`; the mixed model
    tests them on the voices). The factors are those with two or more
    levels among the dimension's judged rows.

    A dimension the data cannot support (constant scores, fewer than 2 prompts, an
    empty cell of the factorial, a fit that does not converge: `NotEstimable`, or a
    singular matrix) gets a 'fits' row with status 'not estimable' and the reason, and
    the other dimensions still run. Any other exception (a missing column, a wrong
    type) is a fault of the inputs or the code and propagates, so the stage fails.
    'fits' has dimension, n, status ('ok' or 'not estimable'), reason and llf;
    'coefficients' rows have status 'ok' when the estimate and its SE are finite (the
    note saying why a p is withheld).
    """
    from voicebias.analysis.sc_stats import (
        JUDGE_MIXED_MODEL,
        beta_regression_stepwise,
        judge_mixed_model,
        rescale_scores,
    )

    ok = scored[scored["judge_status"] == "ok"].copy()
    steps, coefs, kept, fits = [], [], [], []
    mixed, mixed_fits = [], []
    for d in dims:
        try:
            t3, fit_row = judge_mixed_model(ok, d)
            mixed.append(t3)
            mixed_fits.append(fit_row)
        except (NotEstimable, np.linalg.LinAlgError) as exc:
            mixed_fits.append(
                {
                    "dimension": d,
                    "model": JUDGE_MIXED_MODEL,
                    "n": int(ok[d].notna().sum()),
                    "converged": False,
                    # text, not empty: a table read back keeps the row's category (no NaN cells)
                    "variance_components": f"not estimable: {exc}",
                    "generalises_over": "nothing (no fit)",
                    "status": NOT_ESTIMABLE,
                    "reason": str(exc),
                }
            )
        sub = ok.dropna(subset=[d]).copy()
        sub["y"] = rescale_scores(sub[d].astype(float))
        if sub[d].nunique() < 2:
            fits.append(
                {
                    "dimension": d,
                    "n": len(sub),
                    "status": NOT_ESTIMABLE,
                    "reason": "constant scores: no model" if len(sub) else "no judged continuations",
                }
            )
            continue
        factors = [f for f in ("phonation", "voice_gender", "system") if sub[f].nunique() > 1]
        try:
            res = beta_regression_stepwise(
                sub,
                "y",
                factors,
                alpha,
                cluster="prompt_id" if "prompt_id" in sub else None,
                between_unit_factors=("voice_gender",),
            )
        except (NotEstimable, np.linalg.LinAlgError) as exc:  # recorded, the other dimensions still run
            fits.append({"dimension": d, "n": len(sub), "status": NOT_ESTIMABLE, "reason": str(exc)})
            continue
        c = res["coefficients"]
        estimated = np.isfinite(c["estimate"].astype(float)) & np.isfinite(c["se"].astype(float))
        coefs.append(
            c.assign(
                dimension=d,
                status=np.where(estimated, OK, NOT_ESTIMABLE),
                reason=np.where(estimated, c["note"], "no finite estimate or SE"),
            )
        )
        steps.append(res["steps"].assign(dimension=d))
        kept.append(res["kept_interactions"].assign(dimension=d))
        fits.append(
            {"dimension": d, "n": len(sub), "status": OK, "reason": "", "llf": float(res["llf"]["llf"].iloc[0])}
        )
    cat = lambda xs, cols: pd.concat(xs, ignore_index=True) if xs else pd.DataFrame(columns=cols)  # noqa: E731
    return {
        "steps": cat(steps, ["removed", "stat", "df", "den_df", "p_value", "dimension"]),
        "coefficients": cat(
            coefs, ["term", "estimate", "se", "p_value", "testable", "note", "dimension", *STATUS_COLUMNS]
        ),
        "kept_interactions": cat(kept, ["term", "testable", "dimension"]),
        "fits": pd.DataFrame(fits, columns=["dimension", "n", *STATUS_COLUMNS, "llf"]),
        "mixed": cat(
            mixed,
            [
                "term",
                "f_value",
                "num_df",
                "den_df",
                "p_value",
                "testable",
                "note",
                "dimension",
                "model",
                *STATUS_COLUMNS,
            ],
        ),
        "mixed_fits": pd.DataFrame(
            mixed_fits,
            columns=[
                "dimension",
                "model",
                "n",
                "converged",
                "variance_components",
                "generalises_over",
                *STATUS_COLUMNS,
            ],
        ),
    }


#: the columns of reports/sc/planted_vs_recovered.csv
SC_PLANTED_COLUMNS = [*PLANTED_HEAD, *SIMULTANEOUS_COLUMNS, "recovered_ok"]


def planted_vs_recovered(
    truths: dict[str, dict[str, Any]], ret: pd.DataFrame, scored: pd.DataFrame, vq_type3: pd.DataFrame
) -> pd.DataFrame:
    """For reference continuation systems (`truths`: system -> planted truth, as recorded
    by the continue stage): planted retention and passive rate by gender beside the estimates.
    The passive rate's unit is the prompt x voice (one framing drawn for all its phonation
    conditions), with a Wilson interval over those units.

    Retention is judged on H1-H2, whose change the parametric converter makes linear
    in preset strength (a tilt in dB); CPPS responds non-linearly to added noise and
    jitter, so its retention is reported in the retention table but not compared.
    Even H1-H2 is not exactly linear (the creak's PSOLA resynthesis and the aspiration
    noise move it a little on their own), so a retention counts as recovered within
    RETENTION_TOLERANCE of the planted share, not by CI coverage: the bootstrap CI
    over the embedded default's 15 prompts is narrower (about +-0.01) than that converter bias.

    The passive rates are the values checked by an interval: each has its own Wilson interval at
    95 % (`planted_in_ci`) and one at the simultaneous coverage over the system's passive rates
    (voicebias.analysis.planted.with_simultaneous); a passive rate is recovered (`recovered_ok`)
    when its planted value lies in the simultaneous interval.
    """
    rows = []
    for s, truth in sorted(truths.items()):
        for g in GENDERS:
            r = ret[(ret["system"] == s) & (ret["voice_gender"] == g) & (ret["measure"] == H1_H2)]
            if len(r):
                r = r.iloc[0]
                rows.append(
                    {
                        "system": s,
                        "quantity": f"retention_{H1_H2}_{g}",
                        "planted": truth["retention"][g],
                        "recovered": r["retention"],
                        "ci_low": r["ci_low"],
                        "ci_high": r["ci_high"],
                        "planted_in_ci": bool(r["ci_low"] <= truth["retention"][g] <= r["ci_high"]),
                        "recovered_ok": bool(abs(r["retention"] - truth["retention"][g]) <= RETENTION_TOLERANCE),
                    }
                )
            sg = scored[(scored["system"] == s) & (scored["voice_gender"] == g) & (scored["judge_status"] == "ok")]
            if len(sg) and "agency_competence" in sg:
                # the unit is the prompt x voice: its phonation conditions continue the same text
                # (the reference system draws the framing once per prompt and voice), so the four
                # judged copies of one draw are one observation, not four; k sums the units' shares
                passive = (sg["agency_competence"].astype(float) <= 2).astype(float)
                units = [c for c in ("prompt_id", "voice_id") if c in sg]
                shares = passive.groupby([sg[c] for c in units]).mean() if units else passive
                k, n = float(shares.sum()), len(shares)
                lo, hi = wilson(k, n)
                rows.append(
                    {
                        "system": s,
                        "quantity": f"passive_rate_{g}",
                        "planted": truth["passive_rate"][g],
                        "recovered": k / n,
                        "ci_low": lo,
                        "ci_high": hi,
                        "planted_in_ci": bool(lo <= truth["passive_rate"][g] <= hi),
                        "interval": wilson_interval(k, n),
                    }
                )
        from voicebias.analysis.sc_stats import GENERALISING_MODEL

        for model, suffix in (("continuation - prompt", ""), (GENERALISING_MODEL, "_voices_and_prompts_random")):
            t = vq_type3[(vq_type3["measure"] == H1_H2) & (vq_type3["model"] == model)]
            term = t[
                t["term"].str.contains("source")
                & t["term"].str.contains("voice_gender")
                & t["term"].str.contains("phonation")
                & ~t["term"].str.contains("system")
            ]
            if len(term):
                p = float(term["p_value"].iloc[0])
                fem_less = bool(truth["retention"]["female"] < truth["retention"]["male"])
                rf = ret[(ret["system"] == s) & (ret["measure"] == H1_H2)].set_index("voice_gender")["retention"]
                rows.append(
                    {
                        "system": s,
                        "quantity": f"source_x_gender_x_phonation_p_{H1_H2}{suffix}",
                        "planted": np.nan,
                        "recovered": p,
                        "ci_low": np.nan,
                        "ci_high": np.nan,
                        "planted_in_ci": None,
                        "recovered_ok": bool(
                            p < 0.05 and ((rf.get("female", np.nan) < rf.get("male", np.nan)) == fem_less)
                        ),
                    }
                )
    out = with_simultaneous(rows, 0.95)
    if len(out):
        passive = out["quantity"].str.startswith("passive_rate_")
        out.loc[passive, "recovered_ok"] = out.loc[passive, "planted_in_simultaneous_ci"]
    return out.reindex(columns=SC_PLANTED_COLUMNS)


@single_blas_thread
def analyse(
    scored: pd.DataFrame,
    prompt_measures: pd.DataFrame,
    truths: dict[str, dict[str, Any]] | None = None,
    n_boot: int = 500,
    seed: int = 0,
) -> dict[str, pd.DataFrame]:
    """Every SC analysis on the scored table (all systems) and the prompts' measures;
    `truths` (system -> planted truth) adds the planted-vs-recovered table."""
    from voicebias.analysis.sc_stats import all_systems_succeeded, similarity_table, success_table, voice_quality_models
    from voicebias.instruments.judge import load_rubric

    dims = [d for d in load_rubric()["dimensions"] if d in scored]
    order = {c: i for i, c in enumerate(CONDITIONS)}
    success = success_table(scored)
    common = all_systems_succeeded(scored)
    success["all_systems_succeeded"] = common["stimulus_id"].nunique()
    sim = similarity_table(common.dropna(subset=["speaker_similarity"]))
    sim = sim.sort_values(
        ["system", "phonation", "voice_gender"], key=lambda s: s.map(order) if s.name == "phonation" else s
    ).reset_index(drop=True)
    vq = vq_long(common, prompt_measures)
    models = voice_quality_models(vq, measures=SC_MEASURES)
    vq_means = (
        per_system_view(vq)
        .melt(
            id_vars=["system", "source", "phonation", "voice_gender"],
            value_vars=list(SC_MEASURES),
            var_name="measure",
            value_name="value",
        )
        .groupby(["system", "measure", "source", "phonation", "voice_gender"])["value"]
        .agg(mean="mean", sd="std", n="size")
        .reset_index()
    )
    ret = retention(vq, n_boot=n_boot, seed=seed)
    judge_tab = judge_score_table(common, dims)
    jm = judge_models(common, dims)
    out = {
        "success": success,
        "speaker_similarity": sim,
        "vq_means": vq_means,
        "vq_type3": models["type3"],
        "vq_contrasts": models["contrasts"],
        "vq_fits": models["fits"],
        "retention": ret,
        "judge_scores": judge_tab,
        "judge_beta_steps": jm["steps"],
        "judge_beta_coefficients": jm["coefficients"],
        "judge_beta_kept": jm["kept_interactions"],
        "judge_beta_fits": jm["fits"],
        "judge_mixed_type3": jm["mixed"],
        "judge_mixed_fits": jm["mixed_fits"],
    }
    if truths:
        out["planted_vs_recovered"] = planted_vs_recovered(truths, ret, common, models["type3"])
    return out
