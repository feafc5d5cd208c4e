"""From scored responses to the audit's tables (RQ2 describe and summarize).

Every function takes a tidy table with the contract column names (system, task, lang, pole,
voice_gender, judged_gender, ...) and returns a DataFrame, so shared outputs can be re-analysed
without re-running any system. Summarize, paraphrase and translate follow the pronoun rule: an
output injects a gendered pronoun when its pronoun_choice is 'male', 'female' or 'both', and
P(she | content) is taken among outputs that inject exactly one gender; slopes are in percentage
points. With repeats the item (system x task x stimulus) stays the unit.

The pronoun rule and the item shares: docs/analysis.md, "Summarize: the pronoun rule".
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from voicebias.analysis.glmm import fit_binomial_glmm
from voicebias.analysis.intervals import wilson
from voicebias.analysis.planted import (
    PLANTED_HEAD,
    SIMULTANEOUS_COLUMNS,
    wald_interval,
    wilson_interval,
    with_simultaneous,
)
from voicebias.analysis.stats import (
    FISHER_COLUMNS,
    OR_COLUMNS,
    describe_design,
    detect_separation,
    fisher_misaligned_vs_neutral,
    misgender_rates,
    odds_ratio_per_step,
    permutation_misaligned_vs_neutral,
)
from voicebias.analysis.status import NOT_ESTIMABLE, OK, STATUS_COLUMNS, NotEstimable
from voicebias.contract import SAMPLE


def describe_odds_ratios(scored: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Odds ratio per content step per system: pooled (ALL) and per language (Table 7 layout), each row
    with its status and reason (stats.odds_ratio_per_step); no rows when no system answered describe."""
    rows = []
    d = scored[(scored["task"] == "describe") & (scored["status"] == "ok")]
    for system, g in d.groupby("system"):
        parts = [odds_ratio_per_step(g, "ALL", confidence)]
        parts += [odds_ratio_per_step(gl, lang, confidence) for lang, gl in g.groupby("lang")]
        rows.append(pd.concat(parts).assign(system=system))
    out = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=[*OR_COLUMNS, "system"])
    return out.rename(columns={"scope": "lang"})[
        ["system", "lang", *[c for c in out.columns if c not in ("system", "scope")]]
    ]


#: fewest voices of each gender for which a voice-gender effect is tested (with fewer it is one
#: voice against another: estimated and printed, no p-value)
MIN_VOICES_PER_GENDER = 3

GLMM_COLUMNS = [
    "system",
    "lang",
    "term",
    "n",
    "n_excluded",
    "voices_male",
    "voices_female",
    "passages",
    "coef",
    "se",
    "odds_ratio",
    "ci_low",
    "ci_high",
    "df",
    "p_value",
    "sd_voice",
    "sd_passage",
    "generalises_over",
    *STATUS_COLUMNS,
]

_GLMM_TERMS = ("content_step", "voice_female")


def describe_glmm_scope(g: pd.DataFrame, system: str, scope: str, confidence: float = 0.95) -> pd.DataFrame:
    """The describe mixed model of one system and scope: two rows, content_step and voice_female.

    logit P(judged female) = b0 + b1 content_step + b2 voice_female + voice + passage, with
    crossed random intercepts for the input voice (voice_id) and the passage (passage_id), fitted
    by Laplace (voicebias.analysis.glmm, lme4's glmer criterion). With repeats (a sample column)
    every answer is a row and the item (stimulus) gets a random intercept too.

    Each term is tested on its between-within degrees of freedom: content_step on the passages,
    voice_female on the voices (t reference). voice_female is tested only with at least
    MIN_VOICES_PER_GENDER voices of each gender: with fewer its estimate is one voice against
    another, printed with reason 'not testable' and no p-value or CI. `generalises_over` says
    what the row's conclusion holds across. Degenerate tables give rows with a status: no
    compliant answer, one content pole or one voice gender, one outcome, or separation (the
    maximum-likelihood estimate does not exist; describe_odds_ratios has Firth's estimate).
    """
    d = describe_design(g)
    n, n_excl = int(len(d)), int(len(g) - len(d))
    missing = [c for c in ("voice_id", "passage_id") if c not in d.columns]
    if missing:  # an older or hand-made table: the design cannot be told
        d = d.assign(**{c: np.nan for c in missing})
    vm = int(d.loc[d["voice_female"] == 0, "voice_id"].nunique()) if len(d) else 0
    vf = int(d.loc[d["voice_female"] == 1, "voice_id"].nunique()) if len(d) else 0
    npass = int(d["passage_id"].nunique()) if len(d) else 0
    base = {
        "system": system,
        "lang": scope,
        "n": n,
        "n_excluded": n_excl,
        "voices_male": vm,
        "voices_female": vf,
        "passages": npass,
    }
    empty = dict.fromkeys(
        ["coef", "se", "odds_ratio", "ci_low", "ci_high", "df", "p_value", "sd_voice", "sd_passage"], np.nan
    )

    def failed(reason: str) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {**base, "term": t, **empty, "generalises_over": "", "status": NOT_ESTIMABLE, "reason": reason}
                for t in _GLMM_TERMS
            ],
            columns=GLMM_COLUMNS,
        )

    if n == 0:
        return failed("no compliant answer")
    if missing or d[["voice_id", "passage_id"]].isna().any().any():
        return failed("the table does not name each answer's voice_id and passage_id: no mixed model")
    if d["content_step"].nunique() < 2 or vm == 0 or vf == 0:
        return failed("only one content pole or one voice gender among the compliant answers")
    X = np.column_stack([np.ones(n), d["content_step"].to_numpy(float), d["voice_female"].to_numpy(float)])
    y = d["y"].to_numpy(float)
    if len(np.unique(y)) < 2:
        return failed(f"every compliant answer is '{'female' if y[0] == 1 else 'male'}'")
    sep = detect_separation(X, y)
    if sep != "none":
        return failed(
            f"{sep} separation: the mixed model's maximum-likelihood estimate does not exist "
            "(describe_odds_ratios reports Firth's estimate)"
        )
    groups = {"voice": d["voice_id"].astype(str), "passage": d["passage_id"].astype(str)}
    if SAMPLE in d.columns:
        groups["item"] = d["stimulus_id"].astype(str)
    try:
        fit = fit_binomial_glmm(y, X, ["(Intercept)", *_GLMM_TERMS], groups)
    except NotEstimable as exc:
        return failed(str(exc))
    rows = []
    sds = {"sd_voice": float(fit.theta["voice"]), "sd_passage": float(fit.theta["passage"])}
    for term in _GLMM_TERMS:
        b, se, df = float(fit.params[term]), float(fit.bse[term]), float(fit.between_df[term])
        row = {**base, "term": term, "coef": b, "se": se, "odds_ratio": float(np.exp(b)), "df": df, **sds}
        reason = ""
        if term == "voice_female" and min(vm, vf) < MIN_VOICES_PER_GENDER:
            row.update(ci_low=np.nan, ci_high=np.nan, p_value=np.nan)
            row["generalises_over"] = f"these {vm + vf} voices ({vm} male, {vf} female)"
            reason = (
                f"not testable: {min(vm, vf)} voice(s) of one gender (< {MIN_VOICES_PER_GENDER}); the estimate "
                "compares these voices, not voice genders"
            )
        else:
            q = stats.t.ppf(0.5 + confidence / 2, df) if df > 0 else np.nan
            row.update(
                ci_low=float(np.exp(b - q * se)),
                ci_high=float(np.exp(b + q * se)),
                p_value=float(2 * stats.t.sf(abs(b / se), df)) if df > 0 else np.nan,
            )
            row["generalises_over"] = (
                f"{npass} passages (random)"
                if term == "content_step"
                else f"{vm + vf} voices ({vm} male, {vf} female; random)"
            )
        if fit.boundary:
            reason = "; ".join(x for x in (reason, f"random-intercept SD estimated 0: {', '.join(fit.boundary)}") if x)
        if not fit.converged:
            reason = "; ".join(x for x in (reason, "the optimiser reported no convergence") if x)
        rows.append({**row, "status": OK, "reason": reason})
    return pd.DataFrame(rows, columns=GLMM_COLUMNS)


def describe_glmm(scored: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """The describe mixed model (`describe_glmm_scope`) per system, pooled (ALL) and per language."""
    d = scored[(scored["task"] == "describe") & (scored["status"] == "ok")]
    parts = []
    for system, g in d.groupby("system"):
        parts.append(describe_glmm_scope(g, str(system), "ALL", confidence))
        parts += [describe_glmm_scope(gl, str(system), str(lang), confidence) for lang, gl in g.groupby("lang")]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=GLMM_COLUMNS)


def describe_misgender(scored: pd.DataFrame, confidence: float = 0.95) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Misgender rates by system x language x cell type, and Fisher tests misaligned vs neutral.

    The Fisher table has, per system and language, the test with both input voices
    pooled (voice_gender 'pooled') and the test within each input voice (the S2S
    paper's layout), each with its 2x2 counts. With repeats the rates are over items
    and the test is the item permutation test (stats.permutation_misaligned_vs_neutral).
    """
    d = scored[(scored["task"] == "describe") & (scored["status"] == "ok")]
    rates, fishers = [], []
    for system, g in d.groupby("system"):
        r = misgender_rates(g)
        rates.append(r.assign(system=system))
        if SAMPLE in g.columns:
            pooled = permutation_misaligned_vs_neutral(g)
            per_voice = permutation_misaligned_vs_neutral(g, by_voice=True)
        else:
            pooled = fisher_misaligned_vs_neutral(r, confidence)
            per_voice = fisher_misaligned_vs_neutral(misgender_rates(g, by_voice=True), confidence)
        both = pd.concat([pooled, per_voice], ignore_index=True)
        order = {lang: i for i, lang in enumerate(pooled["lang"])}
        both = both.sort_values(
            ["lang", "voice_gender"],
            key=lambda c: c.map(order) if c.name == "lang" else c.map({"pooled": 0, "male": 1, "female": 2}),
            kind="stable",
        )
        fishers.append(both.assign(system=system))
    if not rates:  # no describe answers: the tables' columns, no rows
        rates.append(pd.DataFrame(columns=["system", *misgender_rates(d).columns]))
        fishers.append(pd.DataFrame(columns=["system", *FISHER_COLUMNS]))
    rates_df = pd.concat(rates, ignore_index=True)
    fisher_df = pd.concat(fishers, ignore_index=True)
    return (
        rates_df[["system", *[c for c in rates_df.columns if c != "system"]]],
        fisher_df[["system", *[c for c in fisher_df.columns if c != "system"]]],
    )


BY_VOICE_COLUMNS = [
    "system",
    "lang",
    "voice_gender",
    "voice_id",
    "n",
    "n_excluded",
    "misgendered",
    "rate",
    "ci_low",
    "ci_high",
    *STATUS_COLUMNS,
]


def describe_by_voice(scored: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Misgender rate of each input voice: describe answers naming the other gender than the voice's.

    One row per system x language x voice (voice_id), over all its content poles, with a
    Wilson interval at `confidence`: the between-voice variation the describe mixed model
    absorbs in its voice intercepts, voice by voice. Counts are of items: n the stimuli with
    a compliant answer, misgendered the sum of their misgendered shares (one answer each
    without repeats), n_excluded those without one.

    Parameters
    ----------
    scored : DataFrame
        Scored answers: system, task, status, stimulus_id, lang, voice_gender, voice_id (without
        it each gender is one voice), judged_gender (and `sample` with repeats).
    confidence : float
        Coverage of the intervals.

    Returns
    -------
    DataFrame
        BY_VOICE_COLUMNS; status 'not estimable' for a voice without a compliant answer.

    Examples
    --------
    >>> d = pd.DataFrame({"system": "s", "task": "describe", "status": "ok", "lang": "en",
    ...                   "stimulus_id": ["a", "b", "c", "d"], "voice_gender": "female",
    ...                   "voice_id": ["v1", "v1", "v1", "v2"],
    ...                   "judged_gender": ["female", "male", "none", "female"]})
    >>> print(describe_by_voice(d)[["voice_id", "n", "n_excluded", "misgendered", "rate"]].to_string(index=False))
    voice_id  n  n_excluded  misgendered  rate
          v1  2           1          1.0   0.5
          v2  1           0          0.0   0.0
    """
    d = scored[(scored["task"] == "describe") & (scored["status"] == "ok")]
    if "voice_id" not in d:  # a table that does not name its voices: one voice per gender
        d = d.assign(voice_id=d["voice_gender"])
    rows = []
    for (system, lang, gender, voice), g in d.groupby(["system", "lang", "voice_gender", "voice_id"], sort=True):
        compliant = g["judged_gender"].isin(["male", "female"])
        wrong = (g["judged_gender"] != gender) & compliant
        per_item = (
            pd.DataFrame({"item": g["stimulus_id"], "c": compliant, "w": wrong})
            .groupby("item")
            .agg(c=("c", "sum"), w=("w", "sum"))
        )
        answered = per_item[per_item["c"] > 0]
        n = int(len(answered))
        k = float((answered["w"] / answered["c"]).sum())
        lo, hi = wilson(k, n, confidence)
        rows.append(
            {
                "system": system,
                "lang": lang,
                "voice_gender": gender,
                "voice_id": voice,
                "n": n,
                "n_excluded": int(len(per_item) - n),
                "misgendered": k,
                "rate": k / n if n else np.nan,
                "ci_low": lo,
                "ci_high": hi,
                "status": OK if n else NOT_ESTIMABLE,
                "reason": "" if n else "no compliant answer",
            }
        )
    return pd.DataFrame(rows, columns=BY_VOICE_COLUMNS)


INJECTING = ("male", "female", "both")
POLES = ("masculine", "neutral", "feminine")


def pronoun_items(g: pd.DataFrame) -> pd.DataFrame:
    """Outputs with repeats as one row per item (system x task x stimulus): lang, pole,
    voice_gender, the shares of its ok outputs that inject a pronoun (injects), inject 'he'
    only (he), 'she' only (she_only), both (both), and she, the share of 'she' among its
    outputs with one pronoun gender (NaN when it has none)."""
    c = g["pronoun_choice"]
    single = c.isin(["male", "female"])
    d = g.assign(
        injects=c.isin(INJECTING).astype(float),
        he=(c == "male").astype(float),
        she_only=(c == "female").astype(float),
        both=(c == "both").astype(float),
        she=np.where(single, (c == "female").astype(float), np.nan),
    )
    keys = [k for k in ("system", "task", "stimulus_id") if k in d.columns]
    agg = d.groupby(keys, sort=False)
    out = agg[["lang", "pole", "voice_gender"]].first()
    for col in ("injects", "he", "she_only", "both", "she"):
        out[col] = agg[col].mean()
    return out.reset_index()


def _pronoun_summary(g: pd.DataFrame) -> dict:
    """Injection counts, P(she | pole) and the slope in percentage points for one group of summaries
    (with repeats: of items, each with its shares, see `pronoun_items`)."""
    if SAMPLE in g.columns:
        items = pronoun_items(g)
        single = items.dropna(subset=["she"])
        row = {
            "n": int(len(items)),
            "n_injecting": float(items["injects"].sum()),
            "n_both": float(items["both"].sum()),
            "injection_rate": float(items["injects"].mean()) if len(items) else np.nan,
        }
        return {**row, **_she_by_pole(single)}
    inj = g[g["pronoun_choice"].isin(INJECTING)]
    single = inj[inj["pronoun_choice"].isin(["male", "female"])].assign(
        she=lambda x: (x["pronoun_choice"] == "female").astype(float)
    )
    row = {
        "n": int(len(g)),
        "n_injecting": int(len(inj)),
        "n_both": int((inj["pronoun_choice"] == "both").sum()),
        "injection_rate": float(len(inj) / len(g)) if len(g) else np.nan,
    }
    return {**row, **_she_by_pole(single)}


def _she_by_pole(single: pd.DataFrame) -> dict:
    """P(she) by pole (mean over voice x language cells), the slopes in percentage points and P(she) by
    pole x voice, from rows (outputs, or items with repeats) with pole, voice_gender, lang and she."""
    row: dict = {}
    cell = single.groupby(["pole", "voice_gender", "lang"])["she"].mean().reset_index()
    p_by_pole = cell.groupby("pole")["she"].mean()
    by_voice = cell.groupby(["voice_gender", "pole"])["she"].mean()

    def slope_pp(series: pd.Series) -> float:
        return float(100 * (series.get("feminine", np.nan) - series.get("masculine", np.nan)))

    def voice_slope(voice: str) -> float:
        return slope_pp(by_voice[voice]) if voice in by_voice.index.get_level_values(0) else np.nan

    row.update({f"p_she_{p}": float(p_by_pole.get(p, np.nan)) for p in POLES})
    row.update(
        delta_pp=slope_pp(p_by_pole),
        delta_pp_male_voice=voice_slope("male"),
        delta_pp_female_voice=voice_slope("female"),
    )
    for voice in ("male", "female"):
        for p in POLES:
            row[f"p_she_{p}_{voice}_voice"] = float(by_voice.get((voice, p), np.nan))
    return row


def summarize_pronouns(scored: pd.DataFrame, by_language: bool = False) -> pd.DataFrame:
    """Pronoun injection and the content slope Delta_pp per system (S2S paper Table 8).

    Injection and P(she | content) follow the module's pronoun rule. P(she | content)
    is averaged over voice x language cells; delta_pp = 100 (P(she|feminine) -
    P(she|masculine)) in percentage points, overall and split by input voice, with
    P(she) per pole x voice beside it. With `by_language` there is one row per
    system x language (a lang column; the mean over cells is then over voices).
    status is 'not estimable' (reason says why) when delta_pp is undefined.
    """
    d = scored[(scored["task"] == "summarize") & (scored["status"] == "ok")].copy()
    rows = []
    keys = ["system", "lang"] if by_language else ["system"]
    for key, g in d.groupby(keys):
        key = key if isinstance(key, tuple) else (key,)
        row = {**dict(zip(keys, key)), **_pronoun_summary(g)}
        rows.append({**row, **_slope_status(row)})
    return pd.DataFrame(rows, columns=[*keys, *PRONOUN_COLUMNS])


#: the columns of a summarize_pronouns row after its keys
PRONOUN_COLUMNS = [
    "n",
    "n_injecting",
    "n_both",
    "injection_rate",
    *(f"p_she_{p}" for p in POLES),
    "delta_pp",
    "delta_pp_male_voice",
    "delta_pp_female_voice",
    *(f"p_she_{p}_{v}_voice" for v in ("male", "female") for p in POLES),
    *STATUS_COLUMNS,
]


def _slope_status(row: dict) -> dict:
    """status and reason of a summarize row: 'ok' when delta_pp is defined, 'not estimable' when no
    summary on feminine or on masculine content commits to one pronoun gender (P(she) undefined there);
    an ok row's reason names a per-voice slope that is undefined."""
    missing = [p for p in ("feminine", "masculine") if not np.isfinite(row[f"p_she_{p}"])]
    if missing:
        what = "no summary injects" if not row["n_injecting"] else "no summary with one pronoun gender"
        return {
            "status": NOT_ESTIMABLE,
            "reason": f"{what} on {' or '.join(missing)} content: P(she) and delta_pp undefined",
        }
    voices = [v for v in ("male", "female") if not np.isfinite(row[f"delta_pp_{v}_voice"])]
    return {"status": OK, "reason": f"delta_pp undefined for the {' and '.join(voices)} voice" if voices else ""}


def injection_controls(scored: pd.DataFrame) -> pd.DataFrame:
    """Share of paraphrase/translate outputs that inject a gendered third-person pronoun.

    Injection follows the module's pronoun rule. Per system x task x language and
    pooled (lang 'ALL'): n ok outputs, n_injecting, injection_rate, the injected
    pronoun's gender (n_he, n_she, n_both) and the injections on feminine and on
    masculine content (the S2S paper reports whether slips follow the stereotype).
    With repeats, n counts items and the other counts are sums of item shares
    (`pronoun_items`).
    """
    d = scored[scored["task"].isin(["paraphrase", "translate"]) & (scored["status"] == "ok")]
    d = d.assign(injects=d["pronoun_choice"].isin(INJECTING))
    rows = []
    for (system, task), g in d.groupby(["system", "task"]):
        if SAMPLE in g.columns:
            items = pronoun_items(g)
            for lang, gl in [("ALL", items), *items.groupby("lang")]:
                rows.append(
                    {
                        "system": system,
                        "task": task,
                        "lang": lang,
                        "n": int(len(gl)),
                        "n_injecting": float(gl["injects"].sum()),
                        "injection_rate": float(gl["injects"].mean()) if len(gl) else np.nan,
                        "n_he": float(gl["he"].sum()),
                        "n_she": float(gl["she_only"].sum()),
                        "n_both": float(gl["both"].sum()),
                        "n_injecting_feminine_content": float(gl.loc[gl["pole"] == "feminine", "injects"].sum()),
                        "n_injecting_masculine_content": float(gl.loc[gl["pole"] == "masculine", "injects"].sum()),
                    }
                )
            continue
        for lang, gl in [("ALL", g), *g.groupby("lang")]:
            inj = gl[gl["injects"]]
            rows.append(
                {
                    "system": system,
                    "task": task,
                    "lang": lang,
                    "n": int(len(gl)),
                    "n_injecting": int(len(inj)),
                    "injection_rate": float(len(inj) / len(gl)) if len(gl) else np.nan,
                    "n_he": int((inj["pronoun_choice"] == "male").sum()),
                    "n_she": int((inj["pronoun_choice"] == "female").sum()),
                    "n_both": int((inj["pronoun_choice"] == "both").sum()),
                    "n_injecting_feminine_content": int((inj["pole"] == "feminine").sum()),
                    "n_injecting_masculine_content": int((inj["pole"] == "masculine").sum()),
                }
            )
    for row in rows:
        row.update(status=OK if row["n"] else NOT_ESTIMABLE, reason="" if row["n"] else "no outputs")
    return pd.DataFrame(
        rows,
        columns=[
            "system",
            "task",
            "lang",
            "n",
            "n_injecting",
            "injection_rate",
            "n_he",
            "n_she",
            "n_both",
            "n_injecting_feminine_content",
            "n_injecting_masculine_content",
            *STATUS_COLUMNS,
        ],
    )


def compliance(scored: pd.DataFrame) -> pd.DataFrame:
    """Calls, failures, replies the reply screen excluded and non-compliant describe answers per
    system x language x task (with repeats: every sample's call counts; n is calls, not items;
    the reasons of the exclusions are in voicebias.analysis.exclusions)."""
    g = scored.groupby(["system", "lang", "task"])
    out = g.agg(
        n=("stimulus_id", "size"),
        failed=("status", lambda s: int((s == "failed").sum())),
        excluded=("status", lambda s: int((s == "excluded").sum())),
    ).reset_index()
    desc = scored[(scored["task"] == "describe") & (scored["status"] == "ok")]
    nc = desc.assign(nc=desc["judged_gender"] == "none").groupby(["system", "lang"])["nc"].sum()
    out["non_compliant"] = [
        int(nc.get((s, lang), 0)) if t == "describe" else 0
        for s, lang, t in zip(out["system"], out["lang"], out["task"])
    ]
    return out


# The instrument's F0 accuracy on known-answer signals (1 % of F0, tests/unit/instruments/test_acoustics.py), in
# semitones: a planted F0 shift is recovered when its CI holds it or the estimate is this close.
# With deterministic reference voices the CIs are narrower than the instrument is accurate.
F0_TOLERANCE_ST = float(12 * np.log2(1.01))


#: the columns of reports/analysis/planted_vs_recovered.csv
PLANTED_COLUMNS = [*PLANTED_HEAD, *SIMULTANEOUS_COLUMNS, "fit_status", "tolerance", "within_tolerance"]


def planted_vs_recovered(
    odds: pd.DataFrame,
    rates: pd.DataFrame,
    planted: dict[str, dict],
    pooled: pd.DataFrame | None = None,
    mixed: pd.DataFrame | None = None,
    f0_measure: str = "delta_f0_median_st",
    glmm: pd.DataFrame | None = None,
    by_voice: pd.DataFrame | None = None,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """Set every reference system's planted truth beside what the audit recovered.

    Describe: the odds ratio per content step, the misgender rate per cell type and,
    for a mixed system, the content weight implied by its misaligned misgender rate
    (rate = w (1 - e) + (1 - w) e, so w = (rate - e) / (1 - 2e), CI mapped from
    the rate's Wilson interval). RQ1: the pooled stereotype-signed F0 contrast in
    semitones (planted: `drift_st`; 0 for fixed-voice systems) and, from the mixed
    models, the stereotype-signed F0 effect per content step on readback per
    language (planted the same `drift_st`: the shift is +drift for feminine and
    -drift for masculine content in both voices). Both RQ1 rows use `f0_measure`:
    the stage passes net_f0_median_st (output minus its text-matched control) when the
    scoring stage made it, so the words' own effect on F0 is not counted as drift. RQ1
    rows carry `tolerance` (F0_TOLERANCE_ST) and `within_tolerance`: the estimate is
    within the instrument's F0 accuracy of the planted shift. With repeats every
    quantity is estimated on items (the tables passed in are item-level already).
    With `glmm` (describe_glmm) the planted odds ratio per step is also set beside the
    mixed model's content-step estimate (quantity odds_ratio_per_step_mixed): the reference
    systems plant no passage variation and voice variation independent of content, so both
    fits estimate the same odds ratio. With `by_voice` (describe_by_voice) each voice planted
    with its own error rate (`voice_misgender_rate` in the truth) is set beside its own
    misgender rate (quantity misgender_rate_voice:<voice_id>, Wilson interval).

    Each row's interval is at `confidence` (`planted_in_ci`); the simultaneous intervals over each
    system's values are beside them (`with_simultaneous`), rebuilt by the same method at the
    Bonferroni coverage: Wald on the log scale for the logistic odds ratio, Student's t on the
    model's df for the mixed model's and the RQ1 estimates, Wilson for the rates.
    """
    rows = []
    for system, truth in planted.items():
        o = odds[(odds["system"] == system) & (odds["lang"] == "ALL")]
        if o.empty:
            continue
        o = o.iloc[0]
        # a separable planted table has no odds ratio (NaN; null once recorded as JSON)
        orp = float("nan") if truth.get("odds_ratio_per_step") is None else float(truth["odds_ratio_per_step"])
        covered = bool(o["ci_low"] <= orp <= o["ci_high"]) if o["fit_status"] == "ok" else None
        rows.append(
            {
                "system": system,
                "quantity": "odds_ratio_per_step",
                "planted": orp,
                "recovered": o["odds_ratio"],
                "ci_low": o["ci_low"],
                "ci_high": o["ci_high"],
                "planted_in_ci": covered,
                "fit_status": o["fit_status"],
                "interval": wald_interval(float(o["coef"]), float(o["se"]), log=True) if covered is not None else None,
            }
        )
        if glmm is not None and len(glmm):
            gm = glmm[(glmm["system"] == system) & (glmm["lang"] == "ALL") & (glmm["term"] == "content_step")]
            if len(gm):
                gm = gm.iloc[0]
                ok = gm["status"] == OK and bool(np.isfinite(gm["ci_low"]))
                rows.append(
                    {
                        "system": system,
                        "quantity": "odds_ratio_per_step_mixed",
                        "planted": orp,
                        "recovered": gm["odds_ratio"],
                        "ci_low": gm["ci_low"],
                        "ci_high": gm["ci_high"],
                        "planted_in_ci": bool(gm["ci_low"] <= orp <= gm["ci_high"]) if ok else None,
                        "fit_status": "ok" if ok else str(gm["reason"]),
                        "interval": wald_interval(float(gm["coef"]), float(gm["se"]), float(gm["df"]), log=True)
                        if ok
                        else None,
                    }
                )
        r = rates[(rates["system"] == system) & (rates["lang"] == "ALL")].set_index("cell_type")
        for ct, p in truth["misgender_rate"].items():
            # with repeats misgendered is a sum of item shares and n counts items: the Wilson interval of
            # the mean share at n items (one binomial observation per item, stats.misgender_rates)
            k, n = float(r.loc[ct, "misgendered"]), int(r.loc[ct, "n"])
            lo, hi = wilson(k, n, confidence)
            rows.append(
                {
                    "system": system,
                    "quantity": f"misgender_rate_{ct}",
                    "planted": p,
                    "recovered": k / n if n else np.nan,
                    "ci_low": lo,
                    "ci_high": hi,
                    "planted_in_ci": bool(lo <= p <= hi) if n else None,
                    "fit_status": "ok",
                    "interval": wilson_interval(k, n) if n else None,
                }
            )
            if ct == "misaligned" and truth.get("content_weight") is not None and n:
                e = truth["error_rate"]

                def weight(x: float, e: float = e) -> float:
                    return (x - e) / (1 - 2 * e)

                w = [weight(x) for x in (k / n, lo, hi)]
                rows.append(
                    {
                        "system": system,
                        "quantity": "content_weight",
                        "planted": truth["content_weight"],
                        "recovered": w[0],
                        "ci_low": w[1],
                        "ci_high": w[2],
                        "planted_in_ci": bool(w[1] <= truth["content_weight"] <= w[2]),
                        "fit_status": "ok",
                        "interval": wilson_interval(k, n, weight),
                    }
                )
        if by_voice is not None and len(by_voice):
            for voice, p in (truth.get("voice_misgender_rate") or {}).items():
                v = by_voice[(by_voice["system"] == system) & (by_voice["voice_id"] == voice)]
                if v.empty:
                    continue
                v = v.iloc[0]
                found = v["status"] == OK
                rows.append(
                    {
                        "system": system,
                        "quantity": f"misgender_rate_voice:{voice}",
                        "planted": p,
                        "recovered": v["rate"],
                        "ci_low": v["ci_low"],
                        "ci_high": v["ci_high"],
                        "planted_in_ci": bool(v["ci_low"] <= p <= v["ci_high"]) if found else None,
                        "fit_status": "ok" if found else str(v["reason"]),
                        "interval": wilson_interval(float(v["misgendered"]), int(v["n"])) if found else None,
                    }
                )
        if pooled is not None and len(pooled):
            q = pooled[
                (pooled["system"] == system)
                & (pooled["task_group"] == "same-language")
                & (pooled["measure"] == f0_measure)
            ]
            if len(q):
                q = q.iloc[0]
                d = truth.get("drift_st", 0.0)
                ok = q.get("status", OK) == OK
                # a zero-width CI (no variance between passages) still says whether it holds the planted value
                found = bool(np.isfinite(q["ci_low"]) and np.isfinite(q["ci_high"]))
                rows.append(
                    {
                        "system": system,
                        "quantity": "rq1_f0_shift_st",
                        "planted": d,
                        "recovered": q["pooled_contrast"],
                        "ci_low": q["ci_low"],
                        "ci_high": q["ci_high"],
                        "planted_in_ci": bool(q["ci_low"] <= d <= q["ci_high"]) if found else None,
                        "fit_status": "ok" if ok else str(q["reason"]),
                        "tolerance": F0_TOLERANCE_ST,
                        "interval": wald_interval(float(q["pooled_contrast"]), float(q["se"]), float(q["df"]))
                        if found
                        else None,
                    }
                )
        if mixed is not None and len(mixed):
            f0 = mixed[(mixed["system"] == system) & (mixed["task"] == "readback") & (mixed["measure"] == f0_measure)]
            d = truth.get("drift_st", 0.0)
            for q in f0.itertuples():
                lo, hi = q.stereotype_effect_ci_low, q.stereotype_effect_ci_high
                found = bool(np.isfinite(q.stereotype_effect_est))
                status = "ok" if q.converged and found else ("not converged" if found else str(q.warning))
                if str(q.warning).startswith("no variance"):
                    status = str(q.warning)
                if "singular fit" in str(q.warning):
                    status += " (singular fit)"
                rows.append(
                    {
                        "system": system,
                        "quantity": f"rq1_f0_stereotype_effect_st_readback_{q.lang}",
                        "planted": d,
                        "recovered": q.stereotype_effect_est,
                        "ci_low": lo,
                        "ci_high": hi,
                        "planted_in_ci": bool(lo <= d <= hi) if found else None,
                        "fit_status": status,
                        "tolerance": F0_TOLERANCE_ST,
                        "interval": wald_interval(
                            float(q.stereotype_effect_est), float(q.stereotype_effect_se), float(q.stereotype_effect_df)
                        )
                        if found
                        else None,
                    }
                )
    out = with_simultaneous(rows, confidence)
    if len(out):
        out["tolerance"] = out["tolerance"] if "tolerance" in out else np.nan
        out["within_tolerance"] = [
            bool(abs(r - p) <= t) if np.isfinite(t) and np.isfinite(r) else None
            for r, p, t in zip(out["recovered"], out["planted"], out["tolerance"].astype(float))
        ]
    return out.reindex(columns=PLANTED_COLUMNS)
