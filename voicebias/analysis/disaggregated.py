"""Disaggregated results: every rate and mean by group, with score intervals for rates and
item-level bootstrap intervals for means.

One tidy table for both studies (`disaggregate`): one row per group x metric (system x task x
language x voice gender x condition, also pooled over languages), each with its estimate and
interval, and the difference and ratio against the reference group of the same system, task,
language and voice (neutral content; modal phonation; the neutral cell). A rate gets Wilson's
interval, its difference Newcombe's and its ratio Koopman's (`score_row`), which keep their width
at 0/n and n/n. For a mean, items are resampled within each group; the interval is Hesterberg's
(2015) expanded percentile interval, and each row draws from its own random stream, seeded by
`base.seed` and the row's key. `coverage_simulation` checks the intervals on simulated data with
planted values; `rate_coverage` gives the rate intervals' exact coverage.

The rows, the interval, its coverage and why not Fairlearn's MetricFrame: docs/disaggregated.md.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pandas as pd
from scipy import stats

from voicebias.analysis.intervals import koopman_ratio, newcombe_difference, wilson
from voicebias.analysis.repeats import has_repeats, item_means
from voicebias.analysis.rounding import is_constant
from voicebias.analysis.rq1 import ACOUSTIC_TASKS
from voicebias.analysis.stats import cell_type
from voicebias.analysis.status import NOT_ESTIMABLE, OK, STATUS_COLUMNS
from voicebias.contract import CELL_KEYS, SAMPLE

#: S2S acoustic measures shown in the report's RQ1 tables (means of per-item deltas)
RQ1_METRICS = ("delta_composite", "net_composite", "delta_f0_median_st", "net_f0_median_st")
#: SC speaker and voice-quality measures of the continuations, and judge dimensions
SC_VQ = ("h1_h2_db", "h1_a3_db", "cpps_db")
SC_JUDGE = (
    "semantic_coherence",
    "sentence_polarity",
    "agency_competence",
    "emotionalisation_affect_framing",
    "appearance_objectification",
)
#: metrics whose ratio to the reference group is read (rates and positive scales); for
#: signed measures (deltas, dB) only the difference is given
RATIO_METRICS = frozenset({"misgender_rate", "p_she", "injection_rate", "speaker_similarity", *SC_JUDGE})
#: metrics whose items are 0/1 (item shares with repeats): score intervals (`score_row`)
RATE_METRICS = frozenset({"misgender_rate", "p_she", "injection_rate"})

KEYS = list(CELL_KEYS)
#: the columns against the reference group (NaN where there is none)
REF_COLUMNS = (
    "ref_n",
    "ref_estimate",
    "diff",
    "diff_ci_low",
    "diff_ci_high",
    "ratio",
    "ratio_ci_low",
    "ratio_ci_high",
)
COLUMNS = [
    *KEYS,
    "kind",
    "n",
    "estimate",
    "ci_low",
    "ci_high",
    "ci_method",
    "reference",
    *REF_COLUMNS,
    *STATUS_COLUMNS,
]


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    method: str


def expanded_alpha(n: int, confidence: float, df: float | None = None) -> float:
    """The widened two-sided level of the expanded percentile interval for n items.

    `df` is the t quantile's degrees of freedom: n - 1 for one group, n + m - 2 for the
    difference of two (n then the smaller group's size).

    >>> round(expanded_alpha(10, 0.95), 4), round(expanded_alpha(1000, 0.95), 4)
    (0.0171, 0.0496)
    """
    alpha = 1.0 - confidence
    t = stats.t.ppf(1.0 - alpha / 2.0, n - 1 if df is None else df)
    return float(2.0 * stats.norm.sf(np.sqrt(n / (n - 1.0)) * t))


def _interval(replicates: np.ndarray, n: int, confidence: float, spread: bool, df: float | None = None) -> Interval:
    if n < 2:
        return Interval(np.nan, np.nan, "n<2")
    if not spread:
        v = float(replicates[0])
        return Interval(v, v, "no spread")
    a = expanded_alpha(n, confidence, df)
    # no interpolation between order statistics: a ratio's replicates can be inf (reference resampled to 0)
    lo, hi = np.quantile(replicates, [a / 2.0, 1.0 - a / 2.0], method="inverted_cdf")
    return Interval(float(lo), float(hi), "expanded percentile")


def _rng(seed: int, key: Iterable[Any]) -> np.random.Generator:
    digest = zlib.crc32("|".join(str(k) for k in key).encode("utf-8"))
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, digest])


def _means(values: np.ndarray, rng: np.random.Generator, resamples: int) -> np.ndarray:
    idx = rng.integers(0, len(values), size=(resamples, len(values)))
    return values[idx].mean(axis=1)


def bootstrap_row(
    values: np.ndarray, ref: np.ndarray | None, rng: np.random.Generator, resamples: int, confidence: float, ratio: bool
) -> dict[str, Any]:
    """Estimate, difference and ratio against `ref` of the mean of `values`, with their intervals.

    >>> r = bootstrap_row(np.array([0., 1, 1, 0, 1, 1, 1, 0, 1, 1]), np.array([0., 0, 1, 0, 0, 0, 1, 0, 0, 0]),
    ...                   np.random.default_rng(1), 2000, 0.95, ratio=True)
    >>> r["estimate"], round(r["diff"], 12), round(r["ratio"], 3), r["ci_method"]
    (0.7, 0.5, 3.5, 'expanded percentile')
    >>> bool(r["ci_low"] < 0.7 < r["ci_high"]) and bool(r["diff_ci_low"] < 0.5 < r["diff_ci_high"])
    True
    """
    values = np.asarray(values, dtype=float)
    n = len(values)
    est = float(values.mean()) if n else np.nan
    row: dict[str, Any] = {"n": n, "estimate": est}
    spread = n > 0 and not is_constant(values)
    reps = _means(values, rng, resamples) if n else np.array([np.nan])
    iv = _interval(reps, n, confidence, spread)
    row.update(ci_low=iv.low, ci_high=iv.high, ci_method=iv.method)
    row.update(dict.fromkeys(REF_COLUMNS, np.nan))
    if ref is None:
        return row
    ref = np.asarray(ref, dtype=float)
    m = len(ref)
    row["ref_n"] = m
    if not n or not m:
        return row
    ref_est = float(ref.mean())
    ref_reps = _means(ref, rng, resamples)
    both_spread = spread or not is_constant(ref)
    k = min(n, m)
    d = _interval(reps - ref_reps, k, confidence, both_spread, df=n + m - 2)
    row.update(ref_estimate=ref_est, diff=est - ref_est, diff_ci_low=d.low, diff_ci_high=d.high)
    if ratio and ref_est > 0:
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(ref_reps > 0, reps / np.where(ref_reps > 0, ref_reps, 1.0), np.inf)
        r = _interval(q, k, confidence, both_spread, df=n + m - 2)
        row.update(ratio=est / ref_est, ratio_ci_low=r.low, ratio_ci_high=r.high)
    return row


def score_row(values: np.ndarray, ref: np.ndarray | None, confidence: float, ratio: bool) -> dict[str, Any]:
    """Estimate, difference and ratio against `ref` of a rate (items 0/1, or item shares in [0, 1]
    with repeats), with score intervals: Wilson for the rate, Newcombe's hybrid score interval for
    the difference, Koopman's for the ratio (given when the reference rate is above 0). Successes
    are the sum of the item values; a group of fewer than 2 items gets no interval (as
    `bootstrap_row`).

    >>> r = score_row(np.array([0., 1, 1, 0, 1, 1, 1, 0, 1, 1]), np.array([0., 0, 1, 0, 0, 0, 1, 0, 0, 0]),
    ...               0.95, ratio=True)
    >>> r["estimate"], round(r["diff"], 12), round(r["ratio"], 12), r["ci_method"]
    (0.7, 0.5, 3.5, 'wilson')
    >>> [round(r[k], 4) for k in ("ci_low", "ci_high", "diff_ci_low", "diff_ci_high")]
    [0.3968, 0.8922, 0.0665, 0.7398]
    >>> [round(r[k], 3) for k in ("ratio_ci_low", "ratio_ci_high")]
    [1.151, 12.887]
    """
    values = np.asarray(values, dtype=float)
    n = len(values)
    k = float(values.sum())
    est = k / n if n else np.nan
    row: dict[str, Any] = {"n": n, "estimate": est}
    if n < 2:
        row.update(ci_low=np.nan, ci_high=np.nan, ci_method="n<2")
    else:
        lo, hi = wilson(k, n, confidence)
        row.update(ci_low=lo, ci_high=hi, ci_method="wilson")
    row.update(dict.fromkeys(REF_COLUMNS, np.nan))
    if ref is None:
        return row
    ref = np.asarray(ref, dtype=float)
    m = len(ref)
    row["ref_n"] = m
    if not n or not m:
        return row
    k_ref = float(ref.sum())
    ref_est = k_ref / m
    row.update(ref_estimate=ref_est, diff=est - ref_est)
    if n < 2 or m < 2:
        return row
    rlo, rhi = wilson(k_ref, m, confidence)
    _, dlo, dhi = newcombe_difference(est, row["ci_low"], row["ci_high"], ref_est, rlo, rhi)
    row.update(diff_ci_low=dlo, diff_ci_high=dhi)
    if ratio and ref_est > 0:
        q, qlo, qhi = koopman_ratio(k, n, k_ref, m, confidence)
        row.update(ratio=q, ratio_ci_low=qlo, ratio_ci_high=qhi)
    return row


# ------------------------------------------------------------------ item tables


def s2s_items(scored: pd.DataFrame, acoustic: pd.DataFrame | None) -> pd.DataFrame:
    """Long item table of the S2S study: one row per item x metric with its value.

    describe: misgender_rate (1 when the judged gender is not the voice's, among
    compliant answers); summarize: injection_rate (1 when the summary injects a
    gendered pronoun) and p_she (1 for 'she', among summaries with one pronoun gender);
    each acoustically scored task (ACOUSTIC_TASKS of RQ1): the RQ1 measures (RQ1_METRICS) of the rows measured.
    With repeats there is one row per answer (a sample column); `disaggregate` averages them per item.
    """
    parts = []
    ok = scored[scored["status"] == "ok"]
    d = ok[ok["task"] == "describe"]
    d = d[d["judged_gender"].isin(["male", "female"])]
    parts.append(d.assign(metric="misgender_rate", value=(d["judged_gender"] != d["voice_gender"]).astype(float)))
    s = ok[ok["task"] == "summarize"]
    inj = s["pronoun_choice"].isin(["male", "female", "both"])
    parts.append(s.assign(metric="injection_rate", value=inj.astype(float)))
    single = s[s["pronoun_choice"].isin(["male", "female"])]
    parts.append(single.assign(metric="p_she", value=(single["pronoun_choice"] == "female").astype(float)))
    if acoustic is not None and len(acoustic):
        a = acoustic[(acoustic["status"] == "ok") & acoustic["task"].isin(ACOUSTIC_TASKS)]
        present = [m for m in RQ1_METRICS if m in a]
        ids = ["system", "task", "stimulus_id", *([SAMPLE] if has_repeats(a) else []), "lang", "pole", "voice_gender"]
        long = a.melt(id_vars=ids, value_vars=present, var_name="metric", value_name="value").dropna(subset=["value"])
        parts.append(long)
    repeats = any(has_repeats(p) for p in parts)
    cols = [
        "system",
        "task",
        "stimulus_id",
        *([SAMPLE] if repeats else []),
        "lang",
        "pole",
        "voice_gender",
        "metric",
        "value",
    ]
    items = pd.concat([p.reindex(columns=cols) for p in parts], ignore_index=True)
    return items.rename(columns={"pole": "condition"}).assign(study="s2s", condition_factor="content_pole")


def sc_items(scored: pd.DataFrame) -> pd.DataFrame:
    """Long item table of the SC study, on the stimuli every system continued (as the report).

    speaker_similarity and the continuation's voice quality (SC_VQ, measured rows) and
    the judge dimensions (SC_JUDGE, judged rows).
    """
    from voicebias.analysis.sc_stats import all_systems_succeeded

    common = all_systems_succeeded(scored)
    parts = []
    vq = [m for m in ("speaker_similarity", *SC_VQ) if m in common]
    measured = (
        common
        if "measure_status" not in common
        else common[(common["measure_status"] == "ok") | common["measure_status"].isna()]
    )
    for m in vq:
        src = common if m == "speaker_similarity" else measured
        parts.append(src.assign(metric=m, value=src[m]))
    judged = common[common["judge_status"] == "ok"] if "judge_status" in common else common.iloc[:0]
    for m in SC_JUDGE:
        if m in judged:
            parts.append(judged.assign(metric=m, value=judged[m]))
    cols = ["system", "stimulus_id", "lang", "phonation", "voice_gender", "metric", "value"]
    if not parts:
        return pd.DataFrame(columns=[*cols, "study", "task", "condition_factor"])
    items = pd.concat([p[cols] for p in parts], ignore_index=True).dropna(subset=["value"])
    items["value"] = items["value"].astype(float)
    return items.rename(columns={"phonation": "condition"}).assign(
        study="sc", task="continuation", condition_factor="phonation"
    )


# ------------------------------------------------------------------ the table


def _pooled(items: pd.DataFrame) -> pd.DataFrame:
    """The items again as lang 'ALL', and, for describe rates, as cell types over both voices."""
    out = [items, items.assign(lang="ALL")]
    d = items[(items["study"] == "s2s") & (items["metric"] == "misgender_rate")]
    if len(d):
        cells = [cell_type(p, v) for p, v in zip(d["condition"], d["voice_gender"])]
        by_cell = d.assign(condition=cells, condition_factor="cell_type", voice_gender="ALL")
        out += [by_cell, by_cell.assign(lang="ALL")]
    sc = items[items["study"] == "sc"]
    if len(sc):  # the SC paper's 'All' row: every phonation together
        out.append(sc.assign(condition="all"))
        out.append(sc.assign(condition="all", lang="ALL"))
    return pd.concat(out, ignore_index=True)


REFERENCE = {"content_pole": "neutral", "cell_type": "neutral", "phonation": "modal"}


def item_values(items: pd.DataFrame) -> pd.DataFrame:
    """A long item table with repeats (a sample column) as one row per item x metric: the mean
    of the item's samples (rows without a sample, SC items, are kept as they are). Items keep
    the order of their first row, so each item is resampled with all its samples."""
    means = item_means(items, ["value"], keys=["study", "system", "task", "stimulus_id", "metric"])
    return means[[c for c in items.columns if c != SAMPLE]]


def disaggregate(items: pd.DataFrame, resamples: int = 2000, confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """The disaggregated table (COLUMNS) of a long item table (s2s_items / sc_items rows); with
    repeats the samples of an item are first averaged (`item_values`), so n counts items.

    Examples
    --------
    >>> items = pd.DataFrame({"study": "s2s", "system": "a", "task": "describe", "lang": "en",
    ...     "voice_gender": "male", "condition_factor": "content_pole", "metric": "misgender_rate",
    ...     "condition": ["neutral"] * 4 + ["feminine"] * 4, "stimulus_id": list("abcdefgh"),
    ...     "value": [0., 0, 1, 0, 1, 1, 0, 1]})
    >>> t = disaggregate(items, resamples=500, seed=3)
    >>> t = t[(t["lang"] == "en") & (t["condition_factor"] == "content_pole")]
    >>> print(t[["condition", "n", "estimate", "reference", "diff", "ratio"]].to_string(index=False))
    condition  n  estimate reference  diff  ratio
     feminine  4      0.75   neutral   0.5    3.0
      neutral  4      0.25   neutral   NaN    NaN
    """
    if not len(items):
        return pd.DataFrame(columns=COLUMNS)
    if has_repeats(items):
        items = item_values(items)
    pooled = _pooled(items)
    group_keys = [k for k in KEYS if k != "condition"]
    rows = []
    for key, g in pooled.groupby(group_keys, sort=True, dropna=False):
        meta = dict(zip(group_keys, key))
        ref_level = REFERENCE.get(meta["condition_factor"])
        by_level = {lvl: gl["value"].to_numpy(float) for lvl, gl in g.groupby("condition", sort=True)}
        ref = by_level.get(ref_level)
        for level, values in by_level.items():
            full = {**meta, "condition": level}
            use_ref = ref is not None and level not in (ref_level, "all")
            with_ratio = meta["metric"] in RATIO_METRICS
            kind = "rate" if meta["metric"] in RATE_METRICS else "mean"
            if kind == "rate":
                row = score_row(values, ref if use_ref else None, confidence, ratio=with_ratio)
            else:
                rng = _rng(seed, [full[k] for k in KEYS])
                row = bootstrap_row(values, ref if use_ref else None, rng, resamples, confidence, ratio=with_ratio)
            rows.append(
                {
                    **full,
                    "kind": kind,
                    **row,
                    "reference": ref_level if use_ref or level == ref_level else "",
                    **_row_status(row, ref_level if level not in (ref_level, "all") else None, ref is not None),
                }
            )
    out = pd.DataFrame(rows, columns=COLUMNS)
    return out[COLUMNS].reset_index(drop=True)


def _row_status(row: dict[str, Any], ref_level: str | None, has_ref: bool) -> dict[str, str]:
    """status 'ok' for an estimate with its interval (reason: a zero-width interval, or a missing
    reference group, noted), 'not estimable' for a group of fewer than 2 items (no interval)."""
    if row["ci_method"] == "n<2":
        return {"status": NOT_ESTIMABLE, "reason": f"{row['n']} item{'s' if row['n'] != 1 else ''}: no interval"}
    notes = []
    if row["ci_method"] == "no spread":
        notes.append("no spread: every item has the same value (zero-width interval)")
    if ref_level is not None and not has_ref:
        notes.append(f"no {ref_level} items in this group: no difference or ratio")
    return {"status": OK, "reason": "; ".join(notes)}


# ------------------------------------------------------------------ calibration


def coverage_simulation(
    runs: int = 1000, n: int = 10, seed: int = 0, resamples: int = 2000, confidence: float = 0.95
) -> pd.DataFrame:
    """Share of intervals covering the planted value, over `runs` simulated data sets.

    Four planted settings at n items per group (and n in the reference group): a mean of
    normal items (mean 0.3, SD 1) against a reference of mean 0 (difference 0.3); and a
    rate of 0.6 against a reference rate of 0.3 (difference 0.3, ratio 2), each with the
    intervals the table gives it (bootstrap for the mean, score intervals for the rate;
    `rate_coverage` has the rate intervals' exact coverage). Returns one row per quantity:
    setting, quantity, n, planted, runs, covered, coverage and median_width (of the finite
    intervals).
    """
    rng = np.random.default_rng(seed)
    settings = {
        "normal mean": (
            lambda k: rng.normal(0.3, 1.0, k),
            lambda k: rng.normal(0.0, 1.0, k),
            {"estimate": 0.3, "diff": 0.3},
            False,
        ),
        "rate": (
            lambda k: (rng.random(k) < 0.6).astype(float),
            lambda k: (rng.random(k) < 0.3).astype(float),
            {"estimate": 0.6, "diff": 0.3, "ratio": 2.0},
            True,
        ),
    }
    rows = []
    for name, (draw, draw_ref, planted, ratio) in settings.items():
        hits = {q: 0 for q in planted}
        widths = {q: [] for q in planted}
        for _ in range(runs):
            if name == "rate":
                r = score_row(draw(n), draw_ref(n), confidence, ratio)
            else:
                r = bootstrap_row(draw(n), draw_ref(n), rng, resamples, confidence, ratio)
            for q, truth in planted.items():
                prefix = "" if q == "estimate" else f"{q}_"
                lo, hi = r[f"{prefix}ci_low"], r[f"{prefix}ci_high"]
                hits[q] += bool(lo <= truth <= hi)
                widths[q].append(hi - lo)
        for q, truth in planted.items():
            finite = [w for w in widths[q] if np.isfinite(w)]
            rows.append(
                {
                    "setting": name,
                    "quantity": q,
                    "n": n,
                    "planted": truth,
                    "runs": runs,
                    "covered": hits[q],
                    "coverage": hits[q] / runs,
                    "median_width": float(np.median(finite)) if finite else np.nan,
                }
            )
    return pd.DataFrame(rows)


def rate_coverage(
    rates: Iterable[float] = (0.05, 0.1, 0.5, 0.8, 0.95),
    sizes: Iterable[int] = (10, 30),
    reference: float = 0.3,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """Exact coverage of the rate intervals of `score_row`, summed over the binomial distribution of
    the successes (no simulation): for each planted rate p and n items per group, Wilson's interval
    of p, Newcombe's of p - `reference` and Koopman's of p / `reference`, the reference group holding
    n items at rate `reference`.

    Returns one row per rate x n x quantity (rate, difference, ratio): planted, coverage, reported
    (the probability that an interval is given: a ratio needs a reference rate above 0; coverage is
    conditional on it) and mean_width (of the intervals given).
    """
    rows = []
    for n in sizes:
        ks = np.arange(n + 1)
        rows_k = [score_row(np.r_[np.ones(k), np.zeros(n - k)], None, confidence, ratio=False) for k in ks]
        pair = {
            (k1, k2): score_row(
                np.r_[np.ones(k1), np.zeros(n - k1)], np.r_[np.ones(k2), np.zeros(n - k2)], confidence, True
            )
            for k1 in ks
            for k2 in ks
        }
        w_ref = stats.binom.pmf(ks, n, reference)
        for p in rates:
            w = stats.binom.pmf(ks, n, p)
            rate = [(w[k], r["ci_low"], r["ci_high"]) for k, r in zip(ks, rows_k)]
            joint = [(w[k1] * w_ref[k2], r) for (k1, k2), r in pair.items()]
            parts = {
                "rate": (p, rate),
                "difference": (p - reference, [(q, r["diff_ci_low"], r["diff_ci_high"]) for q, r in joint]),
                "ratio": (p / reference, [(q, r["ratio_ci_low"], r["ratio_ci_high"]) for q, r in joint]),
            }
            for quantity, (planted, cells) in parts.items():
                given = [(q, lo, hi) for q, lo, hi in cells if np.isfinite(lo) and np.isfinite(hi)]
                mass = sum(q for q, _, _ in given)
                covered = sum(q for q, lo, hi in given if lo <= planted <= hi)
                rows.append(
                    {
                        "rate": p,
                        "n": n,
                        "quantity": quantity,
                        "planted": planted,
                        "coverage": covered / mass,
                        "reported": mass,
                        "mean_width": sum(q * (hi - lo) for q, lo, hi in given) / mass,
                    }
                )
    return pd.DataFrame(rows)


def rate_coverage_markdown() -> str:
    """`rate_coverage()` as the table of docs/disaggregated.md: coverage per rate and n items."""
    cov = rate_coverage()
    by = cov.set_index(["n", "rate", "quantity"])["coverage"]
    lines = [
        "| n per group | rate | rate (Wilson) | difference from 0.3 (Newcombe) | ratio to 0.3 (Koopman) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n, rate in cov[["n", "rate"]].drop_duplicates().itertuples(index=False):
        cells = " | ".join(f"{by[(n, rate, q)]:.3f}" for q in ("rate", "difference", "ratio"))
        lines.append(f"| {n} | {rate:g} | {cells} |")
    return "\n".join(lines)
