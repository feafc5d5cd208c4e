"""The audit report (markdown and HTML), generated from the analysis tables alone.

No number is typed by hand: every table is rendered from reports/analysis and
reports/carrier_gate, every figure is drawn from the same tables. The words and the
layout are package data in voicebias/report/templates: sections.yaml holds the title and the
sections' titles and captions in report order, intro.txt.j2 the opening paragraph,
report.md.j2 and report.html.j2 the two pages (tables via DataFrame.to_markdown and
DataFrame.to_html). This module only computes the tables and figures.
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")
import jinja2  # noqa: E402
import markupsafe  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

from voicebias.io import read_json, read_table  # noqa: E402

LANG_ORDER = ["en", "es", "zh", "ALL"]


class Section(NamedTuple):
    """One report section's content: its table and, optionally, a figure file under figures/.

    Titles and captions are not here: they live in templates/sections.yaml, keyed like the sections.
    """

    table: pd.DataFrame
    figure: str | None = None


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if abs(v) >= 1000 or (abs(v) < 0.001 and v != 0):
            return f"{v:.2e}"
        return f"{v:.{digits}f}"
    return str(v)


def _p(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    stars = "***" if v < 0.001 else "**" if v < 0.01 else "*" if v < 0.05 else ""
    return ("<.001" if v < 0.001 else f"{v:.3f}") + stars


def gate_table(gate: pd.DataFrame) -> pd.DataFrame:
    """S2S paper Table 6 layout: per language, flips and content-effect p per measure."""
    rows = []
    for lang, g in gate.groupby("lang", sort=False):
        row = {"lang": lang, "flips": f"{int(g['flips'].max())}/{int(g['n'].max())}"}
        for r in g[~g["measure"].str.startswith("hard")].itertuples():
            row[f"p({r.measure})"] = _p(r.p_content)
        row["verdict"] = "fail" if (g["verdict"] == "fail").any() else "pass"
        rows.append(row)
    return pd.DataFrame(rows)


def odds_table(odds: pd.DataFrame) -> pd.DataFrame:
    """S2S paper Table 7 layout: OR per content step by system, per language and pooled."""
    rows = []
    for system, g in odds.groupby("system", sort=False):
        row = {"system": system}
        for lang in LANG_ORDER:
            r = g[g["lang"] == lang]
            if r.empty:
                row[lang] = "–"
                continue
            r = r.iloc[0]
            if r["fit_status"] != "ok":
                row[lang] = "sep." if str(r["fit_status"]).startswith("perfect") else "sing."
            else:
                row[lang] = (
                    f"{_fmt(r['odds_ratio'], 2)} [{_fmt(r['ci_low'], 2)}, {_fmt(r['ci_high'], 2)}] p={_p(r['p_value'])}"
                )
        rows.append(row)
    return pd.DataFrame(rows)


def glmm_table(glmm: pd.DataFrame) -> pd.DataFrame:
    """The describe mixed model (describe_glmm.csv): one row per system x scope x term, the OR with its
    CI, df and p, the random-intercept SDs, what the row generalises over, and why a cell is empty."""
    rows = []
    for r in glmm.to_dict("records"):
        ok = r["status"] == "ok"
        has_ci = ok and np.isfinite(r["ci_low"])
        rows.append(
            {
                "system": r["system"],
                "scope": r["lang"],
                "term": r["term"],
                "OR [95% CI]": f"{_fmt(r['odds_ratio'], 2)} [{_fmt(r['ci_low'], 2)}, {_fmt(r['ci_high'], 2)}]"
                if has_ci
                else (_fmt(r["odds_ratio"], 2) if ok else "–"),
                "df": _fmt(r["df"], 0) if has_ci else "–",
                "p": _p(r["p_value"]) if has_ci else "–",
                "SD voice / passage": f"{_fmt(r['sd_voice'], 2)} / {_fmt(r['sd_passage'], 2)}" if ok else "–",
                "generalises over": r["generalises_over"] if isinstance(r["generalises_over"], str) else "–",
                "note": r["reason"] if isinstance(r["reason"], str) else "",
            }
        )
    return pd.DataFrame(rows)


def misgender_table(rates: pd.DataFrame) -> pd.DataFrame:
    """S2S paper Table 2 describe block: aligned and neutral pooled, misaligned by language."""
    rows = []
    for system, g in rates.groupby("system", sort=False):
        a = g[(g["lang"] == "ALL")].set_index("cell_type")
        row = {
            "system": system,
            "aligned (ALL)": _fmt(a.loc["aligned", "rate"]),
            "neutral (ALL)": _fmt(a.loc["neutral", "rate"]),
        }
        for lang in LANG_ORDER:
            r = g[(g["lang"] == lang) & (g["cell_type"] == "misaligned")]
            row[f"misaligned ({lang})"] = _fmt(r.iloc[0]["rate"]) if len(r) else "–"
        rows.append(row)
    return pd.DataFrame(rows)


def pronoun_table(pron: pd.DataFrame) -> pd.DataFrame:
    """S2S paper Table 8 layout; Δpp in percentage points, P(she) and injection as proportions."""
    cols = {
        "system": "system",
        "lang": "lang",
        "injection_rate": "injects",
        "n_both": "n both",
        "p_she_masculine": "P(she|M)",
        "p_she_neutral": "P(she|N)",
        "p_she_feminine": "P(she|F)",
        "delta_pp": "Δpp (pp)",
        "delta_pp_male_voice": "Δpp male voice (pp)",
        "delta_pp_female_voice": "Δpp female voice (pp)",
    }
    out = pron[[c for c in cols if c in pron]].rename(columns=cols)
    return out.map(lambda v: _fmt(v) if not isinstance(v, str) else v)


def fisher_table(fisher: pd.DataFrame) -> pd.DataFrame:
    """Fisher exact test misaligned vs neutral, within each input voice (the S2S paper's test) and pooled.

    A table of a run with repeats (a `test` column: the item permutation test,
    voicebias.analysis.stats.permutation_misaligned_vs_neutral) shows its misgendered sums of
    item shares to two decimals and names its test."""
    out = fisher.copy()
    repeats = "test" in out.columns
    count = (lambda a: _fmt(float(a), 2)) if repeats else (lambda a: a)
    out["misaligned"] = [f"{count(a)}/{n}" for a, n in zip(out["misaligned_misgendered"], out["misaligned_n"])]
    out["neutral"] = [f"{count(a)}/{n}" for a, n in zip(out["neutral_misgendered"], out["neutral_n"])]
    out["OR (cond. MLE) [95% CI]"] = [
        f"{_fmt(e, 2)} [{_fmt(a, 2)}, {_fmt(b, 2)}]"
        for e, a, b in zip(out["conditional_odds_ratio"], out["ci_low"], out["ci_high"])
    ]
    out["p"] = out["p_value"].map(_p)
    return out[
        [
            "system",
            "lang",
            "voice_gender",
            "misaligned",
            "neutral",
            "OR (cond. MLE) [95% CI]",
            "p",
            *(["test"] if repeats else []),
        ]
    ]


def _effect(est: Any, lo: Any, hi: Any, p: Any) -> str:
    return f"{_fmt(est)} [{_fmt(lo)}, {_fmt(hi)}] p={_p(p)}"


# Columns of rq1_mixed_models.csv and rq1_pooled.csv that their report tables either show (combined into
# formatted cells) or leave out on purpose; any other column of those tables is shown as it is, after these.
RQ1_MIXED_COLUMNS = frozenset(
    {
        "system",
        "lang",
        "task",
        "task_group",
        "measure",
        "units",
        "n",
        *(
            f"{q}_{s}"
            for q in ("stereotype_effect", "misaligned_minus_neutral")
            for s in ("est", "se", "df", "ci_low", "ci_high", "p")
        ),
        "chi2_interaction",
        "df",
        "f_interaction",
        "den_df_interaction",
        "p_interaction",
        "converged",
        "warning",
    }
)
RQ1_POOLED_COLUMNS = frozenset(
    {
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
    }
)


def _is_p_column(name: str) -> bool:
    return name == "p" or name.startswith("p_") or name.endswith("_p") or "_p_" in name


def _cell(name: str, v: Any) -> Any:
    """A value of a column passed through to a report table: p-values starred, floats rounded."""
    if isinstance(v, float) and _is_p_column(name):
        return _p(v)
    return _fmt(v) if isinstance(v, float) else v


def _extra_columns(df: pd.DataFrame, known: frozenset[str]) -> list[str]:
    """Columns of `df` that a report table does not know: shown as they are, so new analysis columns appear."""
    return [c for c in df.columns if c not in known]


def rq1_effects_table(mixed: pd.DataFrame, task: str = "readback") -> pd.DataFrame:
    """RQ1 effect sizes from the mixed model per system x language on one task: the stereotype-signed
    content effect and the misaligned-minus-neutral contrast (estimate [95% CI] p, in the measure's
    units), then the interaction p and the fit's state; then any column of `mixed` not in
    RQ1_MIXED_COLUMNS, as it is."""
    d = mixed[mixed["task"] == task]
    label = {"delta_composite": "Δ composite", "delta_f0_median_st": "Δ F0"}
    extra = _extra_columns(d, RQ1_MIXED_COLUMNS)
    rows = []
    for r, raw in zip(d.itertuples(), d[extra].to_dict("records")):
        rows.append(
            {
                "system": r.system,
                "lang": r.lang,
                "measure": f"{label.get(r.measure, r.measure)} ({r.units})",
                "toward stereotype, per content step": _effect(
                    r.stereotype_effect_est,
                    r.stereotype_effect_ci_low,
                    r.stereotype_effect_ci_high,
                    r.stereotype_effect_p,
                ),
                "misaligned − neutral (signed)": _effect(
                    r.misaligned_minus_neutral_est,
                    r.misaligned_minus_neutral_ci_low,
                    r.misaligned_minus_neutral_ci_high,
                    r.misaligned_minus_neutral_p,
                ),
                "p interaction": _p(r.p_interaction),
                "fit": ("converged" if bool(r.converged) else "not converged")
                + ("; singular" if "singular fit" in str(r.warning) else ""),
                **{c: _cell(c, v) for c, v in raw.items()},
            }
        )
    return pd.DataFrame(rows)


def rq1_interaction_table(
    mixed: pd.DataFrame, task: str = "readback", measure: str = "delta_composite"
) -> pd.DataFrame:
    """S2S paper Table 2 RQ1 block: content x voice interaction p per system and language."""
    d = mixed[(mixed["task"] == task) & (mixed["measure"] == measure)]
    rows = []
    for system, g in d.groupby("system", sort=False):
        row = {"system": system}
        for lang in LANG_ORDER[:-1]:
            r = g[g["lang"] == lang]
            if r.empty:
                row[lang] = "–"
                continue
            r = r.iloc[0]
            row[lang] = _p(r["p_interaction"]) + ("" if bool(r["converged"]) else " (not converged)")
        rows.append(row)
    return pd.DataFrame(rows)


def rq1_pooled_table(pooled: pd.DataFrame) -> pd.DataFrame:
    """Pooled stereotype-signed contrast per system x task group x measure (estimate [95% CI], p); then any
    column of `pooled` not in RQ1_POOLED_COLUMNS, as it is."""
    out = pooled.copy()
    out["contrast [95% CI]"] = [
        f"{_fmt(e)} [{_fmt(a)}, {_fmt(b)}]" for e, a, b in zip(out["pooled_contrast"], out["ci_low"], out["ci_high"])
    ]
    out["p"] = out["p_value"].map(_p)
    out["measure"] = out["measure"].map(
        {"delta_composite": "Δ composite (SD)", "delta_f0_median_st": "Δ F0 (semitones)"}
    )
    extra = _extra_columns(pooled, RQ1_POOLED_COLUMNS)
    out[extra] = pooled[extra].apply(lambda col: col.map(lambda v: _cell(str(col.name), v)))
    return out[["system", "task_group", "measure", "n_voiced_passages", "contrast [95% CI]", "p", *extra]]


def fig_rq1(contrasts: pd.DataFrame, path: Path) -> None:
    d = contrasts[(contrasts["measure"] == "delta_composite") & (contrasts["task_group"] == "same-language")]
    d = d.groupby(["system", "voice_gender"])[["delta_misaligned", "delta_neutral"]].mean()
    ax = d.plot.bar(figsize=(7.5, 3.6), color=["#c44e52", "#999999"], rot=20)
    ax.set_ylabel("Δ composite, output − input (SD)")
    ax.set_title("Rendered voice: misaligned vs neutral content, by input voice")
    ax.legend(["misaligned", "neutral"])
    plt.tight_layout()
    plt.savefig(path, dpi=110)
    plt.close()


def simultaneous_ci(pvr: pd.DataFrame) -> list[str]:
    """Each row's simultaneous interval with its coverage: '[low, high] at 99.81 %', 'unbounded at
    ...' where the method gives no finite interval at that coverage, '–' outside the family."""
    out = []
    for c, a, b in zip(pvr["simultaneous_confidence"], pvr["simultaneous_ci_low"], pvr["simultaneous_ci_high"]):
        if pd.isna(c):
            out.append("–")
        elif pd.isna(a) or pd.isna(b):
            out.append(f"unbounded at {100 * float(c):.2f} %")
        else:
            out.append(f"[{_fmt(a)}, {_fmt(b)}] at {100 * float(c):.2f} %")
    return out


def planted_table(pvr: pd.DataFrame) -> pd.DataFrame:
    out = pvr.copy()
    out["95% CI"] = [f"[{_fmt(a)}, {_fmt(b)}]" for a, b in zip(out["ci_low"], out["ci_high"])]
    cols = ["system", "quantity", "planted", "recovered", "95% CI", "planted_in_ci"]
    if "simultaneous_confidence" in out:
        out["simultaneous CI"] = simultaneous_ci(out)
        cols += ["simultaneous CI", "planted_in_simultaneous_ci"]
    out = out[[*cols, "fit_status"]]
    return out.map(lambda v: _fmt(v) if not isinstance(v, str) else v)


def misgender_cells(rates: pd.DataFrame, dis: pd.DataFrame | None) -> pd.DataFrame:
    """Describe misgender rate per system x language x cell type with its 95 % Wilson CI
    (the disaggregated table's cell-type rows; without it, the rates with no interval)."""
    if dis is not None:
        d = dis[
            (dis["study"] == "s2s") & (dis["metric"] == "misgender_rate") & (dis["condition_factor"] == "cell_type")
        ]
        return d.rename(columns={"condition": "cell_type", "estimate": "rate"})[
            ["system", "lang", "cell_type", "n", "rate", "ci_low", "ci_high"]
        ].reset_index(drop=True)
    return rates.assign(ci_low=np.nan, ci_high=np.nan)[
        ["system", "lang", "cell_type", "n", "rate", "ci_low", "ci_high"]
    ]


def disaggregated_table(dis: pd.DataFrame) -> pd.DataFrame:
    """The disaggregated table's headline rows, all languages pooled: the describe misgender
    rate by cell type and the summarize P(she) by voice x content pole, each with its CI and
    its difference and ratio against the neutral group."""
    d = dis[
        (dis["study"] == "s2s")
        & (dis["lang"] == "ALL")
        & (
            ((dis["metric"] == "misgender_rate") & (dis["condition_factor"] == "cell_type"))
            | (dis["metric"] == "p_she")
        )
    ].copy()

    def ci(est, lo, hi) -> str:
        return "" if pd.isna(est) else f"{_fmt(est)} [{_fmt(lo)}, {_fmt(hi)}]"

    out = pd.DataFrame(
        {
            "system": d["system"],
            "metric": d["metric"],
            "voice": d["voice_gender"],
            "group": d["condition"],
            "n": d["n"].astype(int),
            "estimate [95% CI]": [ci(*r) for r in zip(d["estimate"], d["ci_low"], d["ci_high"])],
            "− neutral [95% CI]": [ci(*r) for r in zip(d["diff"], d["diff_ci_low"], d["diff_ci_high"])],
            "÷ neutral [95% CI]": [ci(*r) for r in zip(d["ratio"], d["ratio_ci_low"], d["ratio_ci_high"])],
            "interval": d["ci_method"],
        }
    )
    return out.reset_index(drop=True)


def fig_misgender(cells: pd.DataFrame, path: Path) -> None:
    """S2S paper Table 2's describe block as bars: aligned and neutral pooled over languages,
    misaligned pooled and per language, per system, each with its 95 % CI."""
    langs = sorted(set(cells["lang"]) - {"ALL"})
    series = [
        ("aligned", "ALL", "aligned, all languages", "#4c72b0"),
        ("neutral", "ALL", "neutral, all", "#999999"),
        ("misaligned", "ALL", "misaligned, all", "#c44e52"),
    ]
    shades = ["#e08f8f", "#eab0a0", "#f2cfc4", "#f7e0d8"]
    series += [("misaligned", lang, f"misaligned, {lang}", shades[i % len(shades)]) for i, lang in enumerate(langs)]
    systems = sorted(set(cells["system"]))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for j, (ct, lang, label, color) in enumerate(series):
        d = cells[(cells["cell_type"] == ct) & (cells["lang"] == lang)].set_index("system").reindex(systems)
        x = np.arange(len(systems)) + (j - (len(series) - 1) / 2) * width
        err = np.vstack([d["rate"] - d["ci_low"], d["ci_high"] - d["rate"]])
        ax.bar(x, d["rate"], width, color=color, label=label, edgecolor="white", linewidth=0.5)
        if np.isfinite(err).any():
            ax.errorbar(x, d["rate"], yerr=np.nan_to_num(err), fmt="none", ecolor="#333333", capsize=2, lw=0.8)
    ax.set_xticks(np.arange(len(systems)))
    ax.set_xticklabels(systems)
    ax.set_ylabel("misgender rate (describe)")
    ax.set_ylim(0, 1.05)
    ax.set_title("Misgender rate by cell, 95% Wilson CI")
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    plt.tight_layout()
    plt.savefig(path, dpi=110)
    plt.close()


def fig_forest(odds: pd.DataFrame, path: Path) -> None:
    """Odds ratio per content step with its 95 % profile CI: one panel per language (all
    languages pooled first), one row per system; a fit without an estimate is named."""
    langs = ["ALL", *sorted(set(odds["lang"]) - {"ALL"})]
    langs = [lang for lang in langs if lang in set(odds["lang"])]
    systems = sorted(set(odds["system"]))
    fig, axes = plt.subplots(
        1, len(langs), figsize=(2.6 * len(langs) + 1.4, 0.45 * len(systems) + 1.4), sharey=True, squeeze=False
    )
    finite = odds[(odds["fit_status"] == "ok")][["ci_low", "ci_high"]].to_numpy(float)
    finite = finite[np.isfinite(finite) & (finite > 0)]
    lo, hi = (float(finite.min()) / 1.5, float(finite.max()) * 1.5) if finite.size else (0.1, 10.0)
    for ax, lang in zip(axes[0], langs):
        d = odds[odds["lang"] == lang].set_index("system").reindex(systems)
        for y, (sysname, r) in enumerate(d.iterrows()):
            if r["fit_status"] == "ok" and np.isfinite(r["odds_ratio"]):
                ax.errorbar(
                    [r["odds_ratio"]],
                    [y],
                    xerr=[[r["odds_ratio"] - r["ci_low"]], [r["ci_high"] - r["odds_ratio"]]],
                    fmt="o",
                    color="#333333",
                    capsize=3,
                    ms=4,
                )
            else:
                ax.text(
                    np.sqrt(lo * hi),
                    y,
                    "no estimate:\n" + str(r["fit_status"]).split(" (")[0],
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="#666666",
                )
        ax.axvline(1, color="#c44e52", ls="--", lw=1)
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.set_title("all languages" if lang == "ALL" else lang, fontsize=9)
        ax.set_yticks(range(len(systems)))
        ax.set_yticklabels(systems)
    axes[0][0].invert_yaxis()  # first system on top (the axes share y)
    fig.supxlabel("odds ratio of a 'female' call per content step (log scale, 95% CI)", fontsize=9)
    fig.suptitle("Describe: content effect with the voice held fixed, per language", fontsize=10)
    plt.tight_layout()
    plt.savefig(path, dpi=110)
    plt.close()


PHONATION_LABELS = {"modal": "Unmod.", "breathy": "Breathy", "creaky": "Creaky", "endcreak": "EndCr.", "all": "All"}
JUDGE_FIGURE_DIMS = ("semantic_coherence", "sentence_polarity", "agency_competence")


def _ordered(df: pd.DataFrame, col: str = "phonation") -> pd.DataFrame:
    order = {k: i for i, k in enumerate(PHONATION_LABELS)}
    return df.assign(_o=df[col].map(order)).sort_values("_o", kind="stable").drop(columns="_o").reset_index(drop=True)


def manipulation_table(check: pd.DataFrame) -> pd.DataFrame:
    """Mean change of each measure per condition x voice (converted - modal; end-creak: second halves)."""
    d = check[
        check["contrast"].isin(
            [
                "converted_vs_modal",
                "second_half_vs_modal_second_half",
                "to_modal_original",
                "margin_over_other_voice_same_gender",
            ]
        )
    ]
    d = d[~((d["phonation"] == "endcreak") & (d["contrast"] == "converted_vs_modal"))]
    d = d.assign(
        col=(
            d["measure"]
            + " "
            + d["contrast"].map(
                {
                    "converted_vs_modal": "Δ",
                    "second_half_vs_modal_second_half": "Δ 2nd half",
                    "to_modal_original": "",
                    "margin_over_other_voice_same_gender": "margin",
                }
            )
        ).str.strip()
    )
    t = d.pivot_table(
        index=["phonation", "voice_gender", "voice_id"], columns="col", values="mean_change"
    ).reset_index()
    t = _ordered(t)
    ok = check.groupby(["phonation", "voice_id"])["ok"].all().rename("all checks pass")
    t = t.join(ok, on=["phonation", "voice_id"])
    return t.map(lambda v: _fmt(v, 2) if isinstance(v, float) else v)


def _sc_ci(dis: pd.DataFrame | None, metric: str) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(system, phonation, voice_gender) -> the disaggregated table's 95 % CI of an SC metric (all languages)."""
    if dis is None:
        return {}
    d = dis[(dis["study"] == "sc") & (dis["metric"] == metric) & (dis["lang"] == "ALL")]
    return {(r.system, r.condition, r.voice_gender): (r.ci_low, r.ci_high) for r in d.itertuples(index=False)}


def _mean_sd_ci(m: float, sd: float, ci: tuple[float, float] | None, sd_style: str = "±") -> str:
    cell = (
        f"{m:.2f} ± {sd:.2f}"
        if sd_style == "±" and pd.notna(sd)
        else (f"{m:.2f} ({sd:.2f})" if pd.notna(sd) else f"{m:.2f}")
    )
    if ci is not None and np.isfinite(ci[0]) and np.isfinite(ci[1]):
        cell += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
    return cell


def sc_similarity_table(sim: pd.DataFrame, dis: pd.DataFrame | None = None) -> pd.DataFrame:
    """SC paper Table 2 layout: rows VQ modification, columns system x gender, mean ± SD
    [95 % item-bootstrap CI of the mean, from the disaggregated table when given]."""
    ci = _sc_ci(dis, "speaker_similarity")
    d = sim.assign(
        cell=[
            _mean_sd_ci(m, s, ci.get((a, p, g)))
            for m, s, a, p, g in zip(sim["mean"], sim["sd"], sim["system"], sim["phonation"], sim["voice_gender"])
        ]
    )
    t = d.pivot(index="phonation", columns=["system", "voice_gender"], values="cell")
    t = t.reindex(columns=sorted(t.columns, key=lambda c: (c[0], c[1] != "male")))
    t.columns = [f"{a} {b.capitalize()}" for a, b in t.columns]
    t = _ordered(t.reset_index())
    t["phonation"] = t["phonation"].map(PHONATION_LABELS)
    return t.rename(columns={"phonation": "VQ Mod."})


def vq_type3_table(t3: pd.DataFrame) -> pd.DataFrame:
    """Type-III F tests per measure and model; an untestable term shows '–' for p and its reason."""
    out = t3.copy()
    out["term"] = out["term"].str.replace(r"C\((\w+), Sum\)", r"\1", regex=True)
    if "num_df" in out and "den_df" in out:
        out["df"] = [f"{_fmt(a, 0)}, {_fmt(b, 1)}" for a, b in zip(out["num_df"], out["den_df"])]
    cols = [c for c in ("measure", "model", "term", "f_value", "chi2", "df", "p_value", "note") if c in out]
    out = out[cols].rename(columns={"p_value": "p", "f_value": "F"})
    if "note" in out:
        out["note"] = out["note"].fillna("")
    if "p" in out:
        out["p"] = out["p"].map(_p)
    return out.map(lambda v: _fmt(v) if isinstance(v, float) else v)


def retention_table(ret: pd.DataFrame) -> pd.DataFrame:
    out = ret.copy()
    out["retention [95% CI]"] = [
        f"{_fmt(r)} [{_fmt(a)}, {_fmt(b)}]" for r, a, b in zip(out["retention"], out["ci_low"], out["ci_high"])
    ]
    return out[["system", "measure", "voice_gender", "n_prompts", "retention [95% CI]"]]


def _judge_ci(scores: pd.DataFrame, dis: pd.DataFrame | None) -> pd.DataFrame:
    """The judge scores with ci_low/ci_high from the disaggregated table (NaN without it)."""
    if dis is None:
        return scores.assign(ci_low=np.nan, ci_high=np.nan)
    d = dis[(dis["study"] == "sc") & (dis["lang"] == "ALL")].rename(
        columns={"metric": "dimension", "condition": "phonation"}
    )[["system", "dimension", "phonation", "voice_gender", "ci_low", "ci_high"]]
    return scores.merge(d, on=["system", "dimension", "phonation", "voice_gender"], how="left")


def judge_table(scores: pd.DataFrame, dis: pd.DataFrame | None = None) -> pd.DataFrame:
    """SC paper Fig. 2 as a table: mean (SD) [95 % CI] per dimension x VQ, columns system x gender."""
    scores = _judge_ci(scores, dis)
    d = scores.assign(
        cell=[
            _mean_sd_ci(m, s, (a, b), sd_style="()")
            for m, s, a, b in zip(scores["mean"], scores["sd"], scores["ci_low"], scores["ci_high"])
        ]
    )
    t = d.pivot(index=["dimension", "phonation"], columns=["system", "voice_gender"], values="cell")
    t.columns = [f"{a} {b.capitalize()}" for a, b in t.columns]
    t = t.reset_index()
    t = _ordered(t).sort_values("dimension", kind="stable").reset_index(drop=True)
    t["phonation"] = t["phonation"].map(PHONATION_LABELS)
    return t.rename(columns={"phonation": "VQ"})


def fig_vq_preservation(means: pd.DataFrame, path: Path) -> None:
    measures = list(dict.fromkeys(means["measure"]))
    systems = list(dict.fromkeys(means["system"]))
    fig, axes = plt.subplots(
        len(systems), len(measures), figsize=(3.4 * len(measures), 2.8 * len(systems)), squeeze=False
    )
    order = [p for p in PHONATION_LABELS if p in set(means["phonation"])]
    for i, sysname in enumerate(systems):
        for j, m in enumerate(measures):
            ax = axes[i][j]
            for (src, g), style in {
                ("prompt", "male"): ("#4c72b0", "--"),
                ("prompt", "female"): ("#c44e52", "--"),
                ("continuation", "male"): ("#4c72b0", "-"),
                ("continuation", "female"): ("#c44e52", "-"),
            }.items():
                d = (
                    means[
                        (means["system"] == sysname)
                        & (means["measure"] == m)
                        & (means["source"] == src)
                        & (means["voice_gender"] == g)
                    ]
                    .set_index("phonation")
                    .reindex(order)
                )
                ax.errorbar(
                    range(len(order)),
                    d["mean"],
                    yerr=d["sd"],
                    color=style[0],
                    ls=style[1],
                    marker="o",
                    capsize=2,
                    label=f"{src}, {g}",
                )
            ax.set_xticks(range(len(order)))
            ax.set_xticklabels([PHONATION_LABELS[p] for p in order])
            ax.set_title(f"{sysname}: {m}", fontsize=9)
    axes[0][0].legend(fontsize=7)
    plt.tight_layout()
    plt.savefig(path, dpi=110)
    plt.close()


def fig_judge(scores: pd.DataFrame, path: Path, dis: pd.DataFrame | None = None) -> None:
    """SC paper Fig. 2: heatmap of the mean judge score per VQ x system/gender, each cell
    with its SD and, given the disaggregated table, its 95 % item-bootstrap CI."""
    scores = _judge_ci(scores, dis)
    dims = [d for d in JUDGE_FIGURE_DIMS if d in set(scores["dimension"])]
    fig, axes = plt.subplots(1, len(dims), figsize=(4.8 * len(dims), 3.9), squeeze=False, sharey=True)
    order = [p for p in PHONATION_LABELS if p in set(scores["phonation"])]
    im = None
    for ax, dim in zip(axes[0], dims):
        d = scores[scores["dimension"] == dim]
        grid = {
            k: d.pivot_table(index="phonation", columns=["system", "voice_gender"], values=k).reindex(order)
            for k in ("mean", "sd", "ci_low", "ci_high")
        }
        piv = grid["mean"]
        im = ax.imshow(piv.to_numpy(float), vmin=1, vmax=5, cmap="viridis", aspect="auto")
        for (r, c), v in np.ndenumerate(piv.to_numpy(float)):
            if np.isfinite(v):
                lo, hi = grid["ci_low"].to_numpy(float)[r, c], grid["ci_high"].to_numpy(float)[r, c]
                text = f"{v:.2f} ({grid['sd'].to_numpy(float)[r, c]:.2f})"
                if np.isfinite(lo) and np.isfinite(hi):
                    text += f"\n[{lo:.2f}, {hi:.2f}]"
                ax.text(c, r, text, ha="center", va="center", fontsize=6.5, color="white" if v < 3.5 else "black")
        ax.set_yticks(range(len(order)))
        if ax is axes[0][0]:
            ax.set_yticklabels([PHONATION_LABELS[p] for p in order])
        ax.set_xticks(range(piv.shape[1]))
        ax.set_xticklabels([f"{a}\n{b}" for a, b in piv.columns], fontsize=7)
        ax.set_title(dim.replace("_", " "), fontsize=9)
    if im is not None:
        fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="judge score (1-5): mean (SD) [95% CI]")
    plt.savefig(path, dpi=110, bbox_inches="tight")
    plt.close()


def sc_sections(
    sc_dir: Path, phonation_dir: Path, fig_dir: Path, dis: pd.DataFrame | None = None
) -> dict[str, Section]:
    """Report sections of the speech-continuation study (empty when its tables are absent)."""
    sections: dict[str, Section] = {}
    check_path = phonation_dir / "manipulation_check.csv"
    if check_path.exists():
        sections["phonation_check"] = Section(manipulation_table(read_table(check_path)))
    flips_path = phonation_dir / "classifier_flips.csv"
    if flips_path.exists():
        flips = _ordered(read_table(flips_path))
        flips["flips"] = [f"{f}/{n}" for f, n in zip(flips["flips"], flips["n"])]
        flips = flips[["voice_gender", "phonation", "classifier", "flips", "mean_margin"]]
        sections["phonation_carrier"] = Section(flips.map(lambda v: _fmt(v, 2) if isinstance(v, float) else v))
    if not (sc_dir / "speaker_similarity.csv").exists():
        return sections
    sim = read_table(sc_dir / "speaker_similarity.csv")
    means = read_table(sc_dir / "vq_means.csv")
    scores = read_table(sc_dir / "judge_scores.csv")
    fig_vq_preservation(means, fig_dir / "vq_preservation.png")
    fig_judge(scores, fig_dir / "judge_scores.png", dis)
    kept = read_table(sc_dir / "judge_beta_kept.csv")
    steps = read_table(sc_dir / "judge_beta_steps.csv")
    sections.update(
        sc_success=Section(read_table(sc_dir / "success.csv")),
        sc_similarity=Section(sc_similarity_table(sim, dis)),
        sc_vq_preservation=Section(vq_type3_table(read_table(sc_dir / "vq_type3.csv")), "vq_preservation.png"),
        sc_retention=Section(retention_table(read_table(sc_dir / "retention.csv"))),
        sc_judge=Section(judge_table(scores, dis), "judge_scores.png"),
        sc_judge_beta=Section(
            pd.concat([steps.assign(step="removed"), kept.assign(step="kept")], ignore_index=True).map(
                lambda v: _fmt(v) if isinstance(v, float) else v
            )
        ),
    )
    if (sc_dir / "judge_mixed_type3.csv").exists():
        mixed = read_table(sc_dir / "judge_mixed_type3.csv")
        cols = ["dimension", "term", "f_value", "num_df", "den_df", "p_value", "note"]
        sections["sc_judge_mixed"] = Section(mixed[cols].map(lambda v: _fmt(v) if isinstance(v, float) else v))
    if (sc_dir / "planted_vs_recovered.csv").exists():
        pvr = read_table(sc_dir / "planted_vs_recovered.csv")
        sections["sc_planted"] = Section(pvr.map(lambda v: _fmt(v) if isinstance(v, float) else v))
    return sections


def _template_env() -> jinja2.Environment:
    """The report templates (package data voicebias/report/templates), with the two table filters."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("voicebias", "report/templates"),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    # cells are already formatted; str() keeps them as they are (no float reformatting, no number parsing)
    env.filters["md_table"] = lambda df: df.map(str).to_markdown(index=False, disable_numparse=True)
    env.filters["html_table"] = lambda df: markupsafe.Markup(
        df.map(str).to_html(index=False, border=0, classes="report-table")
    )
    return env


def psychometric_report_table(table: pd.DataFrame) -> pd.DataFrame:
    """The pooled psychometric rows (lang ALL), one per system x task: slope, PSE per pole and the
    content's shift of the boundary, each with its 95 % CI, the shift in % VTL, and the status."""
    rows = []
    pooled = table[table["lang"] == "ALL"].assign(pole=lambda d: d["pole"].fillna(""))  # "" reads back as NaN
    for (system, task), g in pooled.groupby(["system", "task"], sort=False):
        est = g.set_index(["quantity", "pole"])
        slope = est.loc[("slope", "")]
        row = {
            "system": system,
            "task": task,
            "n": int(slope["n"]),
            "slope per st [95% CI]": _ci_text(slope),
        }
        for (q, pole), r in est.iterrows():
            if q == "pse":
                row[f"PSE {pole} (st) [95% CI]"] = _ci_text(r)
        shift = est[est.index.get_level_values(0) == "shift"].iloc[0]
        row["shift (st) [95% CI]"] = _ci_text(shift)
        row["shift (% VTL)"] = _fmt(shift["estimate_vtl_pct"], 1) if pd.notna(shift["estimate_vtl_pct"]) else "–"
        row["p (shift)"] = _fmt(shift["p_value"], 3) if pd.notna(shift["p_value"]) else "–"
        row["status"] = shift["status"] if slope["status"] == "ok" else slope["status"]
        row["reason"] = shift["reason"] if isinstance(shift["reason"], str) else ""
        rows.append(row)
    return pd.DataFrame(rows)


def _ci_text(r: pd.Series) -> str:
    if pd.isna(r["estimate"]):
        return "–"
    if pd.isna(r["ci_low"]):
        return _fmt(r["estimate"], 2)
    return f"{_fmt(r['estimate'], 2)} [{_fmt(r['ci_low'], 2)}, {_fmt(r['ci_high'], 2)}]"


def fig_psychometric(answers: pd.DataFrame, table: pd.DataFrame, curves: pd.DataFrame, path: Path) -> None:
    """One panel per system (rows: tasks): the share of 'female' answers per step and pole (dots), the
    fitted functions with their pointwise 95 % bands (lines, shaded) and the PSEs (dashed), pooled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = answers[(answers["status"] == "ok") & answers["y"].notna()]
    systems = list(dict.fromkeys(table["system"]))
    tasks = list(dict.fromkeys(table["task"]))
    fig, axes = plt.subplots(
        len(tasks), max(len(systems), 1), figsize=(3.2 * max(len(systems), 1), 2.8 * len(tasks)), squeeze=False
    )
    colours = {"masculine": "#1f77b4", "feminine": "#d62728", "neutral": "#7f7f7f"}
    for i, task in enumerate(tasks):
        for j, system in enumerate(systems):
            ax = axes[i][j]
            mine = ok[(ok["system"] == system) & (ok["task"] == task)]
            est = table[(table["system"] == system) & (table["task"] == task) & (table["lang"] == "ALL")]
            for pole, c in colours.items():
                pts = mine[mine["pole"] == pole].groupby("x_st")["y"].mean()
                if len(pts):
                    ax.plot(pts.index, pts.values, "o", color=c, ms=3, alpha=0.7, label=pole)
                cv = curves[
                    (curves["system"] == system)
                    & (curves["task"] == task)
                    & (curves["lang"] == "ALL")
                    & (curves["pole"] == pole)
                ].sort_values("x_st")
                if len(cv):
                    ax.plot(cv["x_st"], cv["p"], "-", color=c, lw=1.2)
                    ax.fill_between(cv["x_st"], cv["p_low"], cv["p_high"], color=c, alpha=0.15, lw=0)
                pse = est[(est["quantity"] == "pse") & (est["pole"] == pole)]["estimate"]
                if len(pse) and pd.notna(pse.iloc[0]):
                    ax.axvline(float(pse.iloc[0]), color=c, ls="--", lw=0.8)
            ax.set_ylim(-0.03, 1.03)
            ax.set_title(f"{system} / {task}", fontsize=8)
            ax.set_xlabel("F0 above the male endpoint (st)", fontsize=7)
            if j == 0:
                ax.set_ylabel("P(female)" if task == "describe" else "P(she)", fontsize=7)
            ax.tick_params(labelsize=6)
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=len(handles), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    plt.savefig(path, dpi=110)
    plt.close(fig)


def section_texts() -> dict[str, Any]:
    """Report title and each section's title and caption, in report order (templates/sections.yaml)."""
    text = (resources.files("voicebias") / "report" / "templates" / "sections.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def render_report(
    sections: dict[str, Section], intro_context: dict[str, Any], card: dict[str, Any] | None = None
) -> dict[str, str]:
    """Markdown and HTML of the report from its tables: {"md": ..., "html": ...}.

    `sections` maps section keys of templates/sections.yaml to their table (and figure file
    under figures/); sections render in the YAML's order with its titles and captions, and a
    key without a table is left out. `intro_context` fills templates/intro.txt.j2 (params,
    bank, sc_systems, phonation, sc_judge). `card` (voicebias.report.card.card_context) is the
    audit card, shown first, after the intro; None leaves it out.
    """
    texts = section_texts()
    unknown = sorted(set(sections) - set(texts["sections"]))
    if unknown:
        raise KeyError(f"report sections without a title and caption in templates/sections.yaml: {unknown}")
    ordered = [
        {"key": key, **meta, "table": sections[key].table, "figure": sections[key].figure}
        for key, meta in texts["sections"].items()
        if key in sections
    ]
    env = _template_env()
    intro = env.get_template("intro.txt.j2").render(**intro_context).strip()
    ctx = {"title": texts["title"], "intro": intro, "sections": ordered, "card": card}
    return {
        "md": env.get_template("report.md.j2").render(**ctx),
        "html": env.get_template("report.html.j2").render(**ctx),
    }


def build_report(
    params: dict[str, Any],
    analysis_dir: Path,
    gate_dir: Path,
    bank_metrics: Path,
    out_dir: Path,
    sc_dir: Path | None = None,
    phonation_dir: Path | None = None,
    card: dict[str, Any] | None = None,
    disaggregated: Path | None = None,
    psychometric_dir: Path | None = None,
) -> dict[str, Path]:
    """Write report.md, report.html and figures/ under `out_dir`; `card` (card_context) is shown first.

    `disaggregated` (reports/disaggregated/disaggregated.csv) gives the figures and SC tables
    their item-bootstrap CIs and the report its disaggregated section; without it they have none.
    `psychometric_dir` (reports/psychometric) gives the voice-continuum section and its figure.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(exist_ok=True)
    gate = read_table(gate_dir / "gate.csv")
    odds = read_table(analysis_dir / "describe_odds_ratios.csv")
    rates = read_table(analysis_dir / "describe_misgender.csv")
    pron = read_table(analysis_dir / "summarize_pronouns.csv")
    fisher = read_table(analysis_dir / "describe_fisher.csv")
    pvr = read_table(analysis_dir / "planted_vs_recovered.csv")
    comp = read_table(analysis_dir / "compliance.csv")
    bank = read_json(bank_metrics)
    dis = read_table(disaggregated) if disaggregated is not None else None
    fig_misgender(misgender_cells(rates, dis), fig_dir / "misgender_by_cell.png")
    fig_forest(odds, fig_dir / "odds_ratio_forest.png")
    sections: dict[str, Section] = {"carrier_gate": Section(gate_table(gate))}
    if (analysis_dir / "rq1_pooled.csv").exists():
        mixed = read_table(analysis_dir / "rq1_mixed_models.csv")
        contrasts = read_table(analysis_dir / "rq1_contrasts.csv")
        fig_rq1(contrasts, fig_dir / "rq1_delta_by_cell.png")
        sections["rq1_effects"] = Section(rq1_effects_table(mixed))
        sections["rq1_interaction"] = Section(rq1_interaction_table(mixed), "rq1_delta_by_cell.png")
        sections["rq1_pooled"] = Section(rq1_pooled_table(read_table(analysis_dir / "rq1_pooled.csv")))
        if (analysis_dir / "rq1_significance_counts.csv").exists():
            sections["rq1_significance"] = Section(read_table(analysis_dir / "rq1_significance_counts.csv"))
    sections["describe_odds"] = Section(odds_table(odds), "odds_ratio_forest.png")
    if (analysis_dir / "describe_glmm.csv").exists():
        sections["describe_glmm"] = Section(glmm_table(read_table(analysis_dir / "describe_glmm.csv")))
    sections["describe_misgender"] = Section(misgender_table(rates), "misgender_by_cell.png")
    sections["describe_fisher"] = Section(fisher_table(fisher))
    sections["summarize_pronouns"] = Section(pronoun_table(pron))
    if (analysis_dir / "summarize_pronouns_by_lang.csv").exists():
        sections["summarize_pronouns_by_lang"] = Section(
            pronoun_table(read_table(analysis_dir / "summarize_pronouns_by_lang.csv"))
        )
    sections["planted"] = Section(planted_table(pvr))
    sections["compliance"] = Section(comp.groupby("system")[["n", "failed", "non_compliant"]].sum().reset_index())
    if (analysis_dir / "exclusions.csv").exists():
        excluded = read_table(analysis_dir / "exclusions.csv")
        if len(excluded):
            sections["exclusions"] = Section(
                excluded.groupby(["system", "stage", "reason"], sort=True)["n"].sum().reset_index()
            )
    if (analysis_dir / "planted_exclusions.csv").exists():
        planted_excluded = read_table(analysis_dir / "planted_exclusions.csv")
        if len(planted_excluded):
            sections["planted_exclusions"] = Section(planted_excluded)
    if sc_dir is not None and phonation_dir is not None:
        sections.update(sc_sections(sc_dir, phonation_dir, fig_dir, dis))
    if dis is not None:
        sections["disaggregated"] = Section(disaggregated_table(dis))
    if psychometric_dir is not None and (Path(psychometric_dir) / "psychometric.csv").exists():
        ps = read_table(Path(psychometric_dir) / "psychometric.csv")
        if len(ps):
            fig_psychometric(
                read_table(Path(psychometric_dir) / "answers.csv"),
                ps,
                read_table(Path(psychometric_dir) / "curves.csv"),
                fig_dir / "psychometric.png",
            )
            sections["psychometric"] = Section(psychometric_report_table(ps), "psychometric.png")
    intro_context = {
        "params": params,
        "bank": bank,
        "sc_systems": params["run"].get("sc_systems") or [],
        "phonation": params.get("phonation") or {},
        "sc_judge": params.get("sc_judge") or {},
    }
    rendered = render_report(sections, intro_context, card)
    (out_dir / "report.md").write_text(rendered["md"], encoding="utf-8")
    (out_dir / "report.html").write_text(rendered["html"], encoding="utf-8")
    return {"md": out_dir / "report.md", "html": out_dir / "report.html"}
