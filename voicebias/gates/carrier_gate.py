"""Carrier gate (H0): certify that the TTS put no content-driven gender into the inputs.

Per language (S2S paper, App. G), the gate fails on any classifier flip of the intended voice
gender, and on any gender-sensitive measure whose content effect (an F-test of content within
voice) is directional toward the stereotype; the secondary channels' directional p-values are
Holm-adjusted (`p_directional_holm`). An omnibus effect without that direction is reported as
'benign', and a directional one whose feminine-minus-masculine contrast is under NEGLIGIBLE_SHARE
of the male-female separation on that measure as 'negligible'; with `strict`, any omnibus effect
on the headline composite fails. Inputs with a
`phonation` column are judged per language x phonation condition.

The criteria and verdicts: docs/stimuli.md, "The carrier gate".
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats
from statsmodels.regression.linear_model import OLS
from statsmodels.stats.anova import anova_lm

from voicebias.errors import NotFound
from voicebias.validation import ValidationReport, expectations, require_valid

GATE_COLUMNS = [
    "lang",
    "phonation",
    "measure",
    "n",
    "flips",
    "F",
    "df_num",
    "df_den",
    "p_content",
    "fem_minus_masc",
    "p_directional",
    "p_directional_holm",
    "cell_spread",
    "voice_separation",
    "verdict",
    "at_fault",
]


#: A directional content contrast under this share of the male-female voice separation on the same
#: measure is 'negligible', not a leak: on deterministic TTS the within-voice variance is so small that
#: the F-test finds differences far below anything that can move a classification (the S2S paper, App. G,
#: rules its Spanish margin effect benign partly for being <= 0.007 logits against a 13-logit separation).
NEGLIGIBLE_SHARE = 0.01
#: the verdicts that let the pipeline go on
PASSING = ("pass", "benign", "negligible")


def holm(p: list[float]) -> list[float]:
    """Holm-adjusted p-values (step-down, monotone, capped at 1); NaN stays NaN."""
    p_arr = np.asarray(p, dtype=float)
    out = np.full(p_arr.shape, np.nan)
    idx = np.flatnonzero(np.isfinite(p_arr))
    order = idx[np.argsort(p_arr[idx], kind="stable")]
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_arr[i]))
        out[i] = running
    return out.tolist()


def voice_column(df: pd.DataFrame) -> str:
    """The column naming the voice a stimulus is read in: voice_id when the table has it
    (several voices per gender are distinct voices), else voice_gender (one voice each)."""
    return "voice_id" if "voice_id" in df and df["voice_id"].notna().all() else "voice_gender"


def most_shifted(g: pd.DataFrame, measure: str, k: int = 5) -> str:
    """The k feminine-content stimuli whose value, centred on their voice's mean, is
    highest: where a stereotype leak into the carrier shows first."""
    voice = voice_column(g)
    d = g[list(dict.fromkeys(["stimulus_id", "voice_gender", voice, "pole", measure]))].dropna()
    centred = d[measure] - d.groupby(voice)[measure].transform("mean")
    fem = d.assign(c=centred)[d["pole"] == "feminine"].sort_values("c", ascending=False)
    return ", ".join(fem["stimulus_id"].head(k))


def content_within_voice_test(df: pd.DataFrame, measure: str) -> dict[str, float]:
    """F-test of pole nested in voice: y ~ voice  vs  y ~ voice + voice:pole.

    The voice is `voice_column(df)`: with several voices per gender each voice is its own
    block, so a difference between voices that read different shares of a pole is not
    taken for a content effect.
    """
    voice = voice_column(df)
    d = df[list(dict.fromkeys(["voice_gender", voice, "pole", measure]))].dropna()
    d = d.rename(columns={measure: "y", voice: "voice"})
    if voice == "voice_gender":
        d["voice_gender"] = d["voice"]
    reduced = OLS.from_formula("y ~ C(voice)", data=d).fit()
    full = OLS.from_formula("y ~ C(voice) + C(voice):C(pole)", data=d).fit()
    table = anova_lm(reduced, full)
    F, p = float(table["F"].iloc[1]), float(table["Pr(>F)"].iloc[1])
    # Directional contrast, averaged over voices: feminine minus masculine content,
    # Welch t on voice-centred values.
    centred = d["y"] - d.groupby("voice")["y"].transform("mean")
    fem, masc = centred[d["pole"] == "feminine"], centred[d["pole"] == "masculine"]
    t = stats.ttest_ind(fem, masc, equal_var=False)
    cells = d.groupby(["voice", "pole"])["y"].mean()
    spread = float(max(cells[v].max() - cells[v].min() for v in cells.index.get_level_values(0).unique()))
    voice_means = d.groupby("voice_gender")["y"].mean()
    separation = float(voice_means.get("female", np.nan) - voice_means.get("male", np.nan))
    return {
        "n": int(len(d)),
        "F": F,
        "df_num": float(table["df_diff"].iloc[1]),
        "df_den": float(full.df_resid),
        "p_content": p,
        "fem_minus_masc": float(fem.mean() - masc.mean()),
        "p_directional": float(t.pvalue),
        "cell_spread": spread,
        "voice_separation": separation,
    }


def carrier_gate(
    inputs: pd.DataFrame,
    classifiers: list[str],
    alpha: float,
    headline: str = "composite",
    secondary: list[str] | None = None,
    strict: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Gate table (one row per language x measure) and the list of flipped stimuli.

    `inputs` needs lang, pole, voice_gender, stimulus_id, the measures and one
    margin_<classifier> column per classifier (positive = female); with a
    `phonation` column the gate runs per language x phonation condition.
    """
    ok = inputs[inputs["status"] == "ok"].copy()
    if "phonation" not in ok or ok["phonation"].isna().all():
        ok["phonation"] = "all"
    secondary = secondary or []
    missing = [m for m in [headline, *secondary, *[f"margin_{c}" for c in classifiers]] if m not in ok]
    if missing:
        raise NotFound(f"carrier gate: the input measures table has no column(s) {', '.join(missing)}")
    flips_rows = []
    for c in classifiers:
        pred = np.where(ok[f"margin_{c}"] > 0, "female", "male")
        bad = ok[pred != ok["voice_gender"].to_numpy()]
        for r in bad.itertuples():
            flips_rows.append(
                {
                    "lang": r.lang,
                    "phonation": r.phonation,
                    "classifier": c,
                    "stimulus_id": r.stimulus_id,
                    "voice_gender": r.voice_gender,
                    "margin": getattr(r, f"margin_{c}"),
                }
            )
    flips = pd.DataFrame(
        flips_rows, columns=["lang", "phonation", "classifier", "stimulus_id", "voice_gender", "margin"]
    )
    rows = []
    for (lang, phonation), g in ok.groupby(["lang", "phonation"], sort=True):
        n_flips = int(((flips["lang"] == lang) & (flips["phonation"] == phonation)).sum())
        results = {m: content_within_voice_test(g, m) for m in [headline, *secondary]}
        # the headline is tested at alpha; the secondary channels are one family per language
        # (and condition), so their directional tests are Holm-adjusted before they can fail the gate
        adjusted = dict(zip(secondary, holm([results[m]["p_directional"] for m in secondary])))
        adjusted[headline] = results[headline]["p_directional"]
        for m in [headline, *secondary]:
            res = {**results[m], "p_directional_holm": adjusted[m]}
            significant = res["p_content"] < alpha
            toward_stereotype = res["p_directional_holm"] < alpha and res["fem_minus_masc"] > 0
            negligible = abs(res["fem_minus_masc"]) < NEGLIGIBLE_SHARE * abs(res["voice_separation"])
            if significant and strict and m == headline:
                verdict = "fail"
            elif significant and toward_stereotype:
                verdict = "negligible" if negligible else "fail"
            else:
                verdict = "benign" if significant else "pass"
            rows.append(
                {
                    "lang": lang,
                    "phonation": phonation,
                    "measure": m,
                    "flips": n_flips,
                    **res,
                    "verdict": verdict,
                    "at_fault": most_shifted(g, m) if verdict == "fail" else "",
                }
            )
        flipped = flips.loc[(flips["lang"] == lang) & (flips["phonation"] == phonation), "stimulus_id"]
        rows.append(
            {
                "lang": lang,
                "phonation": phonation,
                "measure": "hard:classifier_flips",
                "n": int(len(g)),
                "flips": n_flips,
                "verdict": "fail" if n_flips else "pass",
                "at_fault": ", ".join(flipped.unique()),
            }
        )
    table = pd.DataFrame(rows)
    for col in GATE_COLUMNS:
        if col not in table:
            table[col] = np.nan
    return table[GATE_COLUMNS], flips


VOICE_COLUMNS = [
    "lang",
    "phonation",
    "voice_gender",
    "voice_id",
    "n",
    "flips",
    "f0_median_st",
    "fem_minus_masc",
    "p_directional",
    "p_directional_holm",
    "voice_separation",
    "verdict",
    "at_fault",
]


def voice_certificates(
    inputs: pd.DataFrame, classifiers: list[str], alpha: float, headline: str = "composite"
) -> pd.DataFrame:
    """One row per language x condition x voice: is this voice certified as a carrier?

    A voice fails on any stimulus a classifier hears as the other gender, and when its own
    feminine-minus-masculine contrast on the headline measure (Welch t over its stimuli of
    the two poles) is toward the stereotype at `alpha` after Holm adjustment over the
    language's voices, unless that contrast is under NEGLIGIBLE_SHARE of the language's
    male-female separation ('negligible'). The language-level test of `carrier_gate` pools
    the voices; this table says which voice a leak or a flip belongs to.
    """
    ok = inputs[inputs["status"] == "ok"].copy()
    if "phonation" not in ok or ok["phonation"].isna().all():
        ok["phonation"] = "all"
    if "voice_id" not in ok:
        ok["voice_id"] = ok["voice_gender"]
    rows = []
    for (lang, phonation), g in ok.groupby(["lang", "phonation"], sort=True):
        means = g.groupby("voice_gender")[headline].mean()
        separation = float(means.get("female", np.nan) - means.get("male", np.nan))
        block = []
        for (gender, voice), v in g.groupby(["voice_gender", "voice_id"], sort=True):
            flipped = np.zeros(len(v), dtype=bool)
            for c in classifiers:
                flipped |= np.where(v[f"margin_{c}"] > 0, "female", "male") != v["voice_gender"].to_numpy()
            fem = v.loc[v["pole"] == "feminine", headline].dropna()
            masc = v.loc[v["pole"] == "masculine", headline].dropna()
            p = float(stats.ttest_ind(fem, masc, equal_var=False).pvalue) if min(len(fem), len(masc)) >= 2 else np.nan
            block.append(
                {
                    "lang": lang,
                    "phonation": phonation,
                    "voice_gender": gender,
                    "voice_id": voice,
                    "n": int(len(v)),
                    "flips": int(flipped.sum()),
                    "f0_median_st": float(v["f0_median_st"].mean()) if "f0_median_st" in v else np.nan,
                    "fem_minus_masc": float(fem.mean() - masc.mean()) if len(fem) and len(masc) else np.nan,
                    "p_directional": p,
                    "voice_separation": separation,
                    "at_fault": ", ".join(v.loc[flipped, "stimulus_id"]),
                }
            )
        for row, p_holm in zip(block, holm([r["p_directional"] for r in block])):
            row["p_directional_holm"] = p_holm
            toward = p_holm < alpha and row["fem_minus_masc"] > 0
            negligible = abs(row["fem_minus_masc"]) < NEGLIGIBLE_SHARE * abs(separation)
            if row["flips"]:
                row["verdict"] = "fail"
            elif toward:
                row["verdict"] = "negligible" if negligible else "fail"
            else:
                row["verdict"] = "pass"
            rows.append(row)
    return pd.DataFrame(rows, columns=VOICE_COLUMNS)


def require_gate(table: pd.DataFrame, flips: pd.DataFrame, voices: pd.DataFrame | None = None) -> ValidationReport:
    """Great Expectations suite over the gate table (and the per-voice certificates, when
    given); raises with the stimuli, measures and voices at fault."""
    E = expectations()
    try:
        report = require_valid(
            table,
            "carrier_gate",
            [
                E.ExpectColumnValuesToBeInSet(column="verdict", value_set=list(PASSING)),
                E.ExpectColumnValuesToBeBetween(column="flips", min_value=0, max_value=0),
            ],
        )
        if voices is not None and len(voices):
            require_valid(
                voices,
                "carrier_gate_voices",
                [E.ExpectColumnValuesToBeInSet(column="verdict", value_set=list(PASSING))],
            )
        return report
    except Exception as exc:
        failed = table[table["verdict"] == "fail"]
        lines = [str(exc), "carrier gate failed; the pipeline stops before any system runs:"]
        if voices is not None:
            for r in voices[voices["verdict"] == "fail"].itertuples():
                where_ = r.lang if r.phonation == "all" else f"{r.lang}, {r.phonation}"
                lines.append(
                    f"  [{where_}] voice {r.voice_id} ({r.voice_gender}) not certified: {r.flips} flips"
                    f"{' (' + r.at_fault + ')' if r.at_fault else ''}, feminine-masculine on the headline "
                    f"{r.fem_minus_masc:+.3f} (Holm p={r.p_directional_holm:.3g})"
                )
        for r in failed.itertuples():
            where_ = r.lang if r.phonation == "all" else f"{r.lang}, {r.phonation}"
            if r.measure.startswith("hard"):
                sel = (flips["lang"] == r.lang) & (flips["phonation"] == r.phonation)
                ids = flips.loc[sel, "stimulus_id"].tolist()
                lines.append(
                    f"  [{where_}] {r.flips} classifier flips: {', '.join(ids[:10])}{' ...' if len(ids) > 10 else ''}"
                )
            else:
                lines.append(
                    f"  [{where_}] content effect on {r.measure}: F={r.F:.2f}, p={r.p_content:.3g}, "
                    f"feminine-masculine={r.fem_minus_masc:+.3f} (p={r.p_directional:.3g}), "
                    f"cell spread {r.cell_spread:.3g} vs voice separation {r.voice_separation:.3g}; "
                    f"most shifted feminine-content stimuli: {r.at_fault}"
                )
        raise type(exc)("\n".join(lines)) from None
