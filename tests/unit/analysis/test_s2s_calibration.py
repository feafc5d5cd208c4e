"""Calibration of the S2S statistics on simulated tables shaped like the real design.

Design (tests/support/s2s_design.py): 3 languages x 3 poles x 10 passages x 2 voices per
system, every system answering the same inputs. For each test the audit reports,
null tables give the share of tests rejecting at alpha .05 (false-positive rate) and
tables with planted effects give the share of 95 % intervals covering the planted
value. Bounds: false-positive rate at most .08, and for the tests meant to be exact at
least .02; coverage 92-98 %. Fisher's exact test and its conditional CI are
conservative by design (discreteness); their size and coverage come from exact
enumeration over all 2x2 tables, as does the Wilson interval's coverage, so those
rows carry no Monte-Carlo error. The Wald odds ratio is only reported for fits
without separation; its rows count those fits.

The full study is marked slow (``python -m pytest -m slow tests/unit/analysis/test_s2s_calibration.py -s``
prints the tables); the default run has a reduced version of each with bounds widened
to 3 Monte-Carlo SEs of its smaller number of datasets. The summarize slope Delta_pp
has no interval or test in the audit's tables, so it has no row here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from tests.support.s2s_design import acoustic_table, describe_table, misgender_table
from voicebias.analysis.intervals import wilson
from voicebias.analysis.rq1 import rq1_mixed_models, rq1_pooled
from voicebias.analysis.stats import fisher_misaligned_vs_neutral, misgender_rates, odds_ratio_per_step

ALPHA = 0.05
LOGIT_95 = float(np.log(19.0))
# (intercept, content logit per step, voice logit): the embedded default's reference systems
DESCRIBE_NULL = {"voice_faithful (e = .05)": (-LOGIT_95, 0.0, 2 * LOGIT_95), "moderate voice effect": (-1.0, 0.0, 2.0)}
DESCRIBE_PLANTED = {"content_driven (OR 19)": (-LOGIT_95, LOGIT_95, 0.0), "OR 2.23, voice 1.5": (-1.5, 0.8, 1.5)}
# (input passage sd, input sd, output passage sd, output sd) of the acoustic deltas
ACOUSTIC = {"passage effects": (0.5, 0.4, 0.3, 0.2), "no passage effect": (0.0, 0.4, 0.0, 0.2)}
DRIFTS = (0.5, 0.0, 0.2, 0.0)


def fp_bounds(n: int, exact: bool = True) -> tuple[float, float]:
    """(lower, upper) bound on a rejection rate over n tests: .02 (exact tests only) to .08,
    widened to .05 -+ 3 Monte-Carlo SE when n is small."""
    se = np.sqrt(ALPHA * (1 - ALPHA) / n)
    return (min(0.02, ALPHA - 3 * se) if exact else 0.0), max(0.08, ALPHA + 3 * se)


def coverage_bounds(n: int) -> tuple[float, float]:
    se = np.sqrt(0.95 * 0.05 / n)
    return min(0.92, 0.95 - 3 * se), max(0.98, 0.95 + 3 * se)


def _row(
    statistic: str, scenario: str, kind: str, hits: list[bool] | np.ndarray, datasets: int, exact: bool = True
) -> dict:
    """One table row: the share of hits (rejections or covering intervals) over the tests of n datasets."""
    hits = np.asarray(hits, bool)
    n = len(hits)
    rate = float(hits.mean())
    lo, hi = fp_bounds(n, exact) if kind == "false positive" else coverage_bounds(n)
    return {
        "statistic": statistic,
        "scenario": scenario,
        "kind": kind,
        "datasets": datasets,
        "tests": n,
        "rate": rate,
        "mc_se": float(np.sqrt(max(rate * (1 - rate), 1e-12) / n)),
        "low": lo,
        "high": hi,
        "ok": bool(lo <= rate <= hi),
    }


def _enumerated_row(statistic: str, scenario: str, kind: str, rate: float, exact: bool) -> dict:
    lo, hi = ((0.02 if exact else 0.0), 0.08) if kind == "false positive" else (0.92, 0.98 if exact else 1.0)
    return {
        "statistic": statistic,
        "scenario": scenario,
        "kind": kind,
        "datasets": "exact",
        "tests": "exact",
        "rate": rate,
        "mc_se": 0.0,
        "low": lo,
        "high": hi,
        "ok": bool(lo <= rate <= hi),
    }


# ---------------------------------------------------------------- describe odds ratio


def describe_rows(n_datasets: int, seed: int) -> list[dict]:
    rows = []
    for null, cases in ((True, DESCRIBE_NULL), (False, DESCRIBE_PLANTED)):
        for name, (a, b, v) in cases.items():
            rng = np.random.default_rng([seed, int(null), len(rows)])
            wald, firth, statuses = [], [], []
            for _ in range(n_datasets):
                r = odds_ratio_per_step(describe_table(rng, a, b, v)).iloc[0]
                statuses.append(r["fit_status"])
                if null:
                    firth.append(r["firth_p_value"] < ALPHA)
                    if r["fit_status"] == "ok":
                        wald.append(r["p_value"] < ALPHA)
                else:
                    orv = np.exp(b)
                    firth.append(r["firth_ci_low"] <= orv <= r["firth_ci_high"])
                    if r["fit_status"] == "ok":
                        wald.append(r["ci_low"] <= orv <= r["ci_high"])
            kind = "false positive" if null else "coverage"
            ok_share = np.mean([s == "ok" for s in statuses])
            rows.append(
                _row(
                    "describe OR per step, ML Wald (fits without separation)",
                    f"{name}; {ok_share:.1%} of fits ok",
                    kind,
                    wald,
                    n_datasets,
                )
            )
            rows.append(_row("describe OR per step, Firth (penalised LRT / profile CI)", name, kind, firth, n_datasets))
    return rows


# ---------------------------------------------------------------- misgender rates, Wilson and Fisher

FISHER_SIZES = {
    "per voice and language (10 vs 10)": 10,
    "pooled voices, per language (20 vs 20)": 20,
    "pooled voices, all languages (60 vs 60)": 60,
}


def fisher_exact_rows(sizes: tuple[int, ...] = (10, 20, 60)) -> list[dict]:
    """Exact size of the two-sided Fisher test and exact coverage of its conditional CI and of
    the Wilson interval, by enumeration over every 2x2 table of the design's cell sizes
    (misaligned vs neutral answers: 10 per voice and language, 20 pooling the voices, 60
    pooling the languages too)."""
    rows = []
    for label, n in FISHER_SIZES.items():
        if n not in sizes:
            continue
        k = np.arange(n + 1)
        pv = np.ones((n + 1, n + 1))
        ci = np.full((n + 1, n + 1, 2), np.nan)
        for a in k:
            for c in k:
                rates = pd.DataFrame(
                    {"lang": "x", "cell_type": ["misaligned", "neutral"], "n": n, "misgendered": [int(a), int(c)]}
                )
                f = fisher_misaligned_vs_neutral(rates).iloc[0]
                pv[a, c] = f["p_value"]
                ci[a, c] = f["ci_low"], f["ci_high"]
        for p0 in (0.05, 0.25, 0.5):
            w = np.outer(stats.binom.pmf(k, n, p0), stats.binom.pmf(k, n, p0))
            rows.append(
                _enumerated_row(
                    "Fisher misaligned vs neutral (conservative by design)",
                    f"{label}, misgender rate {p0}",
                    "false positive",
                    float(w[pv < ALPHA].sum()),
                    exact=False,
                )
            )
        for p1, p0 in ((0.5, 0.2), (0.95, 0.5), (0.3, 0.05)):
            w = np.outer(stats.binom.pmf(k, n, p1), stats.binom.pmf(k, n, p0))
            true_or = p1 / (1 - p1) / (p0 / (1 - p0))
            inside = (ci[..., 0] <= true_or) & (true_or <= ci[..., 1])
            rows.append(
                _enumerated_row(
                    "Fisher conditional OR exact CI (conservative by design)",
                    f"{label}, rates {p1} vs {p0}",
                    "coverage",
                    float(w[inside].sum()),
                    exact=False,
                )
            )
    for n in (18, 20, 60):  # the reduced profile's and the embedded default's cell sizes
        k = np.arange(n + 1)
        for p in (0.05, 0.275, 0.5, 0.95):
            inside = [(wilson(int(i), n)[0] <= p <= wilson(int(i), n)[1]) for i in k]
            rows.append(
                _enumerated_row(
                    "misgender rate, Wilson 95 % interval",
                    f"n = {n}, rate {p}",
                    "coverage",
                    float(stats.binom.pmf(k, n, p)[inside].sum()),
                    exact=True,
                )
            )
    return rows


def misgender_rows(n_datasets: int, seed: int) -> list[dict]:
    """Through the audit's own path (misgender_rates -> Fisher per language and voice, Wilson on ALL)."""
    rng = np.random.default_rng([seed, 7])
    null = {"aligned": 0.05, "neutral": 0.25, "misaligned": 0.25}
    planted = {"aligned": 0.05, "neutral": 0.5, "misaligned": 0.95}
    rej_pooled, rej_voice, cover = [], [], []
    for _ in range(n_datasets):
        t = misgender_table(rng, null)
        rej_pooled += list(fisher_misaligned_vs_neutral(misgender_rates(t))["p_value"] < ALPHA)
        rej_voice += list(fisher_misaligned_vs_neutral(misgender_rates(t, by_voice=True))["p_value"] < ALPHA)
        r = misgender_rates(misgender_table(rng, planted))
        for row in r[r["lang"] == "ALL"].itertuples():
            lo, hi = wilson(row.misgendered, row.n)
            cover.append(lo <= planted[row.cell_type] <= hi)
    return [
        _row(
            "Fisher via misgender_rates, pooled voices (conservative by design)",
            "misgender rate .25 in neutral and misaligned cells",
            "false positive",
            rej_pooled,
            n_datasets,
            exact=False,
        ),
        _row(
            "Fisher via misgender_rates, per input voice (conservative by design)",
            "misgender rate .25 in neutral and misaligned cells",
            "false positive",
            rej_voice,
            n_datasets,
            exact=False,
        ),
        _row(
            "misgender rate (ALL) Wilson via misgender_rates", "planted .05 / .5 / .95", "coverage", cover, n_datasets
        ),
    ]


# ---------------------------------------------------------------- RQ1 mixed model


def mixed_rows(n_datasets: int, seed: int) -> list[dict]:
    rows = []
    for name, (ips, isd, ops, osd) in ACOUSTIC.items():
        rng = np.random.default_rng([seed, 11, len(rows)])
        null, planted = [], []
        for _ in range(n_datasets):
            kw = dict(tasks=("readback",), input_passage_sd=ips, input_sd=isd, output_passage_sd=ops, output_sd=osd)
            null.append(rq1_mixed_models(acoustic_table(rng, 1, **kw), "delta_f0_median_st"))
            planted.append(rq1_mixed_models(acoustic_table(rng, 1, drift=(DRIFTS[0],), **kw), "delta_f0_median_st"))
        m, q = pd.concat(null), pd.concat(planted)
        singular = m["warning"].str.contains("singular fit").mean()
        scen = f"{name}; {singular:.0%} singular fits"
        rows.append(
            _row(
                "RQ1 mixed model: interaction F (Satterthwaite df)",
                scen,
                "false positive",
                m["p_interaction"] < ALPHA,
                n_datasets,
            )
        )
        rows.append(
            _row(
                "RQ1 mixed model: interaction Wald chi-square, asymptotic (not reported as p)",
                scen,
                "false positive",
                stats.chi2.sf(m["chi2_interaction"], 2) < ALPHA,
                n_datasets,
            )
        )
        for eff in ("stereotype_effect", "misaligned_minus_neutral"):
            rows.append(
                _row(
                    f"RQ1 mixed model: {eff} t (Satterthwaite df)",
                    scen,
                    "false positive",
                    m[f"{eff}_p"] < ALPHA,
                    n_datasets,
                )
            )
            rows.append(
                _row(
                    f"RQ1 mixed model: {eff} 95 % CI",
                    f"{name}; drift {DRIFTS[0]} st",
                    "coverage",
                    (q[f"{eff}_ci_low"] <= DRIFTS[0]) & (DRIFTS[0] <= q[f"{eff}_ci_high"]),
                    n_datasets,
                )
            )
    return rows


# ---------------------------------------------------------------- RQ1 pooled contrast


def pooled_rows(n_datasets: int, seed: int, systems: tuple[int, ...] = (1, 2, 3, 4)) -> list[dict]:
    rows = []
    for n_sys in systems:
        rng = np.random.default_rng([seed, 13, n_sys])
        rej_each, rej_all, cov_each, cov_all = [], [], [], []
        for _ in range(n_datasets):
            null = acoustic_table(rng, n_sys)
            rej_all += list(rq1_pooled(null, "delta_f0_median_st", pool_systems=True)["p_value"] < ALPHA)
            if n_sys == 1:
                rej_each += list(rq1_pooled(null, "delta_f0_median_st")["p_value"] < ALPHA)
            drift = DRIFTS[:n_sys]
            t = acoustic_table(rng, n_sys, drift=drift)
            a = rq1_pooled(t, "delta_f0_median_st", pool_systems=True)
            cov_all += list((a["ci_low"] <= np.mean(drift)) & (np.mean(drift) <= a["ci_high"]))
            if n_sys == 1:
                e = rq1_pooled(t, "delta_f0_median_st")
                cov_each += list((e["ci_low"] <= drift[0]) & (drift[0] <= e["ci_high"]))
        if n_sys == 1:
            rows.append(
                _row(
                    "RQ1 pooled contrast, per system",
                    "1 system, both task groups",
                    "false positive",
                    rej_each,
                    n_datasets,
                )
            )
            rows.append(
                _row(
                    "RQ1 pooled contrast, per system, 95 % CI", f"drift {drift[0]} st", "coverage", cov_each, n_datasets
                )
            )
        else:
            rows.append(
                _row(
                    "RQ1 pooled contrast, systems pooled (ALL)",
                    f"{n_sys} systems, shared inputs",
                    "false positive",
                    rej_all,
                    n_datasets,
                )
            )
            rows.append(
                _row(
                    "RQ1 pooled contrast, systems pooled (ALL), 95 % CI",
                    f"{n_sys} systems, drifts {drift}",
                    "coverage",
                    cov_all,
                    n_datasets,
                )
            )
    return rows


def show(rows: list[dict], title: str) -> pd.DataFrame:
    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 250, "display.max_colwidth", 90, "display.max_rows", 500):
        print(f"\n{title}\n{table.to_string(index=False, float_format=lambda x: f'{x:.4f}')}")
    return table


def check(table: pd.DataFrame) -> None:
    bad = table[~table["ok"]]
    assert bad.empty, bad.to_string()


# ---------------------------------------------------------------- default run (reduced)


def test_fisher_and_wilson_exact_size_and_coverage_reduced():
    check(show(fisher_exact_rows((10, 20)), "Fisher and Wilson, exact enumeration (reduced)"))


def test_describe_odds_ratio_calibration_reduced():
    check(show(describe_rows(15, seed=0), "describe OR (reduced)"))


def test_misgender_fisher_and_wilson_through_the_tables_reduced():
    check(show(misgender_rows(30, seed=0), "misgender rates (reduced)"))


def test_rq1_mixed_model_calibration_reduced():
    check(show(mixed_rows(12, seed=0), "RQ1 mixed model (reduced)"))


def test_rq1_pooled_contrast_calibration_reduced():
    check(show(pooled_rows(20, seed=0, systems=(1, 4)), "RQ1 pooled contrast (reduced)"))


def test_rq1_pooled_treats_systems_answering_the_same_inputs_as_one_replicate():
    """Identical systems (the same deltas) pooled: the panel contrast and its SE are those of one system."""
    one = acoustic_table(np.random.default_rng(5), 1)
    four = pd.concat([one.assign(system=f"sys{k}") for k in range(4)], ignore_index=True)
    single = rq1_pooled(one, "delta_f0_median_st").set_index("task_group")
    panel = rq1_pooled(four, "delta_f0_median_st", pool_systems=True).set_index("task_group")
    for col in ("pooled_contrast", "se", "df", "ci_low", "ci_high", "p_value"):
        assert panel[col].to_numpy() == pytest.approx(single[col].to_numpy(), rel=1e-10), col
    assert (panel["n_systems"] == 4).all() and (panel["n_cells"] == single["n_cells"]).all()


# ---------------------------------------------------------------- full study


@pytest.mark.slow
def test_s2s_calibration_full():
    rows = [
        *fisher_exact_rows(),
        *describe_rows(300, seed=1),
        *misgender_rows(500, seed=1),
        *mixed_rows(250, seed=1),
        *pooled_rows(300, seed=1),
    ]
    check(show(rows, "S2S calibration (full)"))


R_INTERACTION_F = r"""
suppressMessages(library(lmerTest))
d$pole <- factor(d$pole, levels = c("neutral", "feminine", "masculine"))
d$voice_gender <- factor(d$voice_gender, levels = c("female", "male"))
m <- lmer(delta_composite ~ pole * voice_gender + (1 | passage_id), data = d, REML = TRUE,
          control = lmerControl(optimizer = "bobyqa", optCtrl = list(rhobeg = 1e-3, rhoend = 1e-12)))
i <- grep(":", names(fixef(m)))
L <- matrix(0, length(i), length(fixef(m))); L[cbind(seq_along(i), i)] <- 1
ct <- contest(m, L, joint = TRUE, ddf = "Satterthwaite")
emit("F", ct[["F value"]]); emit("den_df", ct[["DenDF"]]); emit("p", ct[["Pr(>F)"]])
"""


@pytest.mark.parametrize("case", ["interior passage variance", "singular fit"])
def test_rq1_interaction_f_test_matches_lmertest(case):
    """The interaction p is lmerTest's joint F test (Satterthwaite denominator df), not the
    asymptotic chi-square that rejects a true null too often with 30 passages."""
    from tests.support.rref import run_r
    from tests.support.stats import mixed_table, singular_table

    g = mixed_table() if case == "interior passage variance" else singular_table()
    ours = rq1_mixed_models(g).iloc[0]
    ref = run_r(R_INTERACTION_F, d=g[["delta_composite", "pole", "voice_gender", "passage_id"]])
    assert ours["f_interaction"] == pytest.approx(ref["F"], rel=1e-6)
    assert ours["f_interaction"] == pytest.approx(ours["chi2_interaction"] / 2, rel=1e-12)
    assert ours["den_df_interaction"] == pytest.approx(ref["den_df"], rel=1e-5)
    assert ours["p_interaction"] == pytest.approx(ref["p"], rel=1e-5)
