"""Repeats in the analyses (run.samples_per_item > 1): the item stays the unit.

Planted cases: answers drawn k times per item, with a known within-item (between-sample)
variance. Checked: with one sample per item the repeats path is the path without repeats;
identical repeats leave every standard error as it is with one answer per item (they would
shrink by sqrt(k) if repeats counted as items); per-item means drive the estimates (the
describe model against R's glm on the item shares); the planted within-item variance is
recovered (the components against R's aov); the bootstrap draws items with their samples.
"""

import numpy as np
import pandas as pd
import pytest

from tests.support import s2s_design as design
from voicebias.analysis.disaggregated import disaggregate, s2s_items
from voicebias.analysis.repeats import between_sample_variance, item_means, variance_components
from voicebias.analysis.rq1 import rq1_contrasts, rq1_mixed_models, rq1_pooled
from voicebias.analysis.s2s import describe_misgender, describe_odds_ratios, injection_controls, summarize_pronouns
from voicebias.analysis.stats import misgender_rates

OR_FIELDS = [
    "n",
    "n_excluded",
    "odds_ratio",
    "ci_low",
    "ci_high",
    "p_value",
    "coef",
    "se",
    "firth_odds_ratio",
    "firth_ci_low",
    "firth_ci_high",
    "firth_p_value",
]


def repeat(table: pd.DataFrame, k: int) -> pd.DataFrame:
    """Every row k times, samples 0..k-1 in (item, sample) order, the sample column after stimulus_id."""
    out = table.loc[table.index.repeat(k)].copy()
    out.insert(list(out.columns).index("stimulus_id") + 1, "sample", np.tile(np.arange(k), len(table)))
    return out.reset_index(drop=True)


def describe_answers(rng, k, item_sd=1.0, content_logit=0.7, passages=10, system="s"):
    """Describe answers with repeats: logit P(female) = -1.5 + content x step + 3 x female voice + u_item,
    u_item ~ N(0, item_sd); each of the k samples of an item an independent draw at the item's p."""
    d = design.stimuli(passages)
    eta = (
        -1.5
        + content_logit * d["pole"].map(design.STEP)
        + 3.0 * (d["voice_gender"] == "female")
        + rng.normal(0, item_sd, len(d))
    ).to_numpy(float)
    rows = repeat(d.assign(system=system, task="describe", status="ok"), k)
    p = np.repeat(1 / (1 + np.exp(-eta)), k)
    rows["judged_gender"] = np.where(rng.random(len(rows)) < p, "female", "male").astype(object)
    return rows.assign(pronoun_choice=None)  # scored tables carry every score column


def summaries(rng, k, passages=10, system="s", task="summarize"):
    d = design.stimuli(passages)
    p_inj = np.repeat(rng.uniform(0.2, 0.9, len(d)), k)
    rows = repeat(d.assign(system=system, task=task, status="ok"), k)
    she = np.where(rows["pole"] == "feminine", 0.8, np.where(rows["pole"] == "masculine", 0.2, 0.5))
    u = rng.random(len(rows))
    rows["pronoun_choice"] = np.where(
        rng.random(len(rows)) >= p_inj,
        "none",
        np.where(u < 0.1, "both", np.where(u < 0.1 + 0.9 * she, "female", "male")),
    )
    return rows.assign(judged_gender=None)


def acoustic_repeats(rng, k, within_sd, **kw):
    """design.acoustic_table's deltas (one per item) plus sample noise of SD within_sd."""
    a = repeat(design.acoustic_table(rng, **kw).assign(system="s"), k)
    noise = rng.normal(0, within_sd, len(a))
    a["delta_f0_median_st"] = a["delta_f0_median_st"] + noise
    a["delta_composite"] = a["delta_f0_median_st"]
    return a


def assert_frames_close(a, b, cols=None, rtol=1e-9):
    cols = cols or [c for c in a.columns if c in b.columns]
    for c in cols:
        x, y = a[c].reset_index(drop=True), b[c].reset_index(drop=True)
        if pd.api.types.is_numeric_dtype(x) and pd.api.types.is_numeric_dtype(y):
            np.testing.assert_allclose(x.to_numpy(float), y.to_numpy(float), rtol=rtol, atol=1e-12, err_msg=c)
        else:
            assert list(x) == list(y), c


# ------------------------------------------------------------------ one sample: the path without repeats


def test_one_sample_per_item_is_the_analysis_without_repeats():
    rng = np.random.default_rng(1)
    desc = describe_answers(rng, 1).drop(columns="sample")
    summ = summaries(rng, 1).drop(columns="sample")
    para = summaries(rng, 1, task="paraphrase").drop(columns="sample")
    acou = acoustic_repeats(rng, 1, 0.0).drop(columns="sample")
    plain = pd.concat([desc, summ, para], ignore_index=True)
    tagged = plain.assign(sample=0)  # the repeats path, one sample per item
    assert_frames_close(describe_odds_ratios(plain), describe_odds_ratios(tagged))
    rates, _ = describe_misgender(plain)
    rates_r, perm = describe_misgender(tagged)
    assert_frames_close(rates, rates_r)
    assert_frames_close(summarize_pronouns(plain), summarize_pronouns(tagged))
    assert_frames_close(injection_controls(plain), injection_controls(tagged))
    for f in (rq1_contrasts, rq1_mixed_models, rq1_pooled):
        assert_frames_close(f(acou, "delta_composite"), f(acou.assign(sample=0), "delta_composite"))
    items = s2s_items(plain, acou)
    assert_frames_close(
        disaggregate(items, resamples=300, seed=2),
        disaggregate(s2s_items(tagged, acou.assign(sample=0)), resamples=300, seed=2),
    )


def test_permutation_test_of_binary_items_is_fisher_exact():
    """With one binary outcome per item and equal cell sizes (the design's) the item permutation test is
    Fisher's exact test: same two-sided p up to the Monte Carlo error of 20000 draws."""
    rng = np.random.default_rng(3)
    answers = design.misgender_table(rng, {"aligned": 0.05, "neutral": 0.3, "misaligned": 0.55})
    _, fisher = describe_misgender(answers)
    _, perm = describe_misgender(answers.assign(sample=0))
    assert list(perm["test"].unique()) == ["item permutation (20000 draws)"]
    both = fisher.merge(perm, on=["system", "lang", "voice_gender"], suffixes=("", "_perm"))
    assert len(both) == len(fisher) == 12
    mc_se = np.sqrt(both["p_value"] * (1 - both["p_value"]) / 20000)
    assert (np.abs(both["p_value_perm"] - both["p_value"]) <= 4 * mc_se + 1e-4).all()
    assert (both["misaligned_misgendered"] == both["misaligned_misgendered_perm"]).all()


# ------------------------------------------------------------------ identical repeats add no information


def test_identical_repeats_have_the_standard_errors_of_one_answer_per_item():
    rng = np.random.default_rng(4)
    desc = describe_answers(rng, 1).drop(columns="sample")
    acou = acoustic_repeats(rng, 1, 0.0).drop(columns="sample")
    k3_desc, k3_acou = repeat(desc, 3), repeat(acou, 3)

    one, three = describe_odds_ratios(desc), describe_odds_ratios(k3_desc)
    assert_frames_close(one, three, OR_FIELDS)
    # counted as independent answers (the sample column dropped), the SE would shrink by sqrt(3)
    naive = describe_odds_ratios(k3_desc.drop(columns="sample"))
    assert np.allclose(naive["se"], one["se"] / np.sqrt(3), rtol=1e-6)
    assert not np.allclose(naive["se"], three["se"], rtol=1e-3)

    # (an item's mean of three equal floats can differ from them in the last bit; the REML optimum and
    # the Satterthwaite df, a numerical derivative, carry that to about 1e-8 and 1e-6)
    for f, se_cols, rtol in (
        (rq1_mixed_models, ["stereotype_effect_se", "misaligned_minus_neutral_se"], 1e-6),
        (rq1_mixed_models, ["stereotype_effect_df", "p_interaction"], 1e-5),
        (rq1_pooled, ["se", "df", "ci_low", "ci_high"], 1e-8),
        (rq1_contrasts, ["t", "p_value", "cohens_d"], 1e-8),
    ):
        assert_frames_close(f(acou, "delta_composite"), f(k3_acou, "delta_composite"), se_cols, rtol=rtol)
    # taken for items, 3 copies of 10 items per cell would raise every Welch t by sqrt((3 x 10 - 1) / (10 - 1))
    naive = rq1_contrasts(k3_acou.drop(columns="sample"), "delta_composite")
    one = rq1_contrasts(acou, "delta_composite")
    assert np.allclose(naive["t"], one["t"] * np.sqrt(29 / 9), rtol=1e-9)

    rates_1, _ = describe_misgender(desc.assign(sample=0))
    rates_3, _ = describe_misgender(k3_desc)
    assert_frames_close(rates_1, rates_3)
    d1 = disaggregate(s2s_items(desc, acou), resamples=400, seed=5)
    d3 = disaggregate(s2s_items(k3_desc, k3_acou), resamples=400, seed=5)
    assert_frames_close(d1, d3)
    assert (d3["n"] == d1["n"]).all()


# ------------------------------------------------------------------ per-item means drive the estimates


def test_describe_model_is_the_fractional_logit_of_the_item_shares():
    from tests.support.rref import run_r

    rng = np.random.default_rng(6)
    answers = describe_answers(rng, 3, item_sd=1.5)
    answers.loc[answers.index[:4], "judged_gender"] = "none"  # item 0 loses 3 answers of 3, item 1 one of 3
    res = describe_odds_ratios(answers).set_index("lang").loc["ALL"]
    first = answers["stimulus_id"].iloc[0]
    compliant = answers[answers["judged_gender"] != "none"]
    shares = (
        compliant.groupby("stimulus_id", sort=False)
        .agg(
            share=("judged_gender", lambda s: float((s == "female").mean())),
            pole=("pole", "first"),
            voice_gender=("voice_gender", "first"),
        )
        .reset_index()
    )
    shares["content_step"] = shares["pole"].map(design.STEP)
    shares["voice_female"] = (shares["voice_gender"] == "female").astype(float)
    assert res["n"] == len(shares) == 179 and res["n_excluded"] == 1 and first not in set(shares["stimulus_id"])
    ref = run_r(
        """
        f <- suppressWarnings(glm(share ~ content_step + voice_female, family = binomial, data = shares,
                                  control = glm.control(epsilon = 1e-14, maxit = 100)))
        emit("coef", coef(f)[["content_step"]]); emit("se", sqrt(diag(vcov(f)))[["content_step"]])
        emit("p", summary(f)$coefficients["content_step", 4])
        library(brglm2)
        b <- suppressWarnings(glm(share ~ content_step + voice_female, family = binomial, data = shares,
                                  method = "brglmFit", type = "AS_mean"))
        emit("firth", coef(b)[["content_step"]])
    """,
        shares=shares,
    )
    assert res["coef"] == pytest.approx(ref["coef"], rel=1e-6)
    assert res["se"] == pytest.approx(ref["se"], rel=1e-6)
    assert res["p_value"] == pytest.approx(ref["p"], rel=1e-5)
    assert np.log(res["firth_odds_ratio"]) == pytest.approx(ref["firth"], rel=1e-5)
    assert res["fit_status"] == "ok"


def test_rq1_and_rates_are_those_of_the_item_means():
    rng = np.random.default_rng(7)
    acou = acoustic_repeats(rng, 3, 0.4, drift=(0.3,))
    means = item_means(acou, ["delta_composite", "delta_f0_median_st"]).drop(columns="n_samples")
    for f in (rq1_contrasts, rq1_mixed_models, rq1_pooled):
        assert_frames_close(f(acou, "delta_composite"), f(means, "delta_composite"), rtol=1e-10)
    # an unmeasured sample is left out of its item's mean, the item stays
    gap = acou.copy()
    gap.loc[1, "status"] = "excluded"
    m = rq1_contrasts(gap, "delta_composite")
    assert (m["n_misaligned"] + m["n_neutral"]).sum() == (
        rq1_contrasts(acou, "delta_composite")[["n_misaligned", "n_neutral"]].sum().sum()
    )
    answers = describe_answers(rng, 3)
    rates = misgender_rates(answers)
    items = (
        answers.assign(w=(answers["judged_gender"] != answers["voice_gender"]).astype(float))
        .groupby("stimulus_id")
        .agg(w=("w", "mean"), lang=("lang", "first"))
    )
    all_rows = rates[rates["lang"] == "ALL"]
    assert all_rows["n"].sum() == 180 and all_rows["misgendered"].sum() == pytest.approx(items["w"].sum())
    assert float(rates.loc[rates["lang"] == "en", "n"].sum()) == 60


def test_pronoun_tables_count_items_by_their_shares():
    rng = np.random.default_rng(8)
    s3 = summaries(rng, 3)
    row = summarize_pronouns(s3).iloc[0]
    inj = s3["pronoun_choice"].isin(["male", "female", "both"]).groupby(s3["stimulus_id"]).mean()
    assert row["n"] == 180 and row["n_injecting"] == pytest.approx(inj.sum())
    assert row["injection_rate"] == pytest.approx(inj.mean())
    # p_she: mean over items of each item's share of 'she' among its one-gender summaries, by cell, then pole
    single = s3[s3["pronoun_choice"].isin(["male", "female"])]
    she = (single["pronoun_choice"] == "female").groupby(single["stimulus_id"]).mean()
    meta = s3.drop_duplicates("stimulus_id").set_index("stimulus_id")
    cell = (
        pd.DataFrame({"she": she})
        .join(meta[["pole", "voice_gender", "lang"]])
        .groupby(["pole", "voice_gender", "lang"])["she"]
        .mean()
        .groupby("pole")
        .mean()
    )
    assert row["p_she_feminine"] == pytest.approx(cell["feminine"])
    assert row["delta_pp"] == pytest.approx(100 * (cell["feminine"] - cell["masculine"]))
    ctrl = injection_controls(summaries(rng, 3, task="paraphrase"))
    assert ctrl.loc[ctrl["lang"] == "ALL", "n"].item() == 180
    assert ctrl["n_he"].add(ctrl["n_she"]).add(ctrl["n_both"]).sub(ctrl["n_injecting"]).abs().max() < 1e-9


# ------------------------------------------------------------------ the planted between-sample variance

PLANTED_WITHIN, PLANTED_BETWEEN = 0.25, 1.0


def test_planted_between_sample_variance_is_recovered():
    """Continuous answers: item effects of variance 1.0, sample noise of variance 0.25 (within share 0.2),
    1800 items x 3 samples; binary answers: items at p 0.2 or 0.8 (within variance E p(1 - p) = 0.16,
    between variance 0.09), 1800 items x 4 samples."""
    rng = np.random.default_rng(9)
    n, k = 1800, 3
    item = np.repeat(np.arange(n), k)
    y = np.repeat(rng.normal(0, np.sqrt(PLANTED_BETWEEN), n), k) + rng.normal(0, np.sqrt(PLANTED_WITHIN), n * k)
    v = variance_components(y, item)
    assert v["within_variance"] == pytest.approx(PLANTED_WITHIN, rel=0.06)
    assert v["between_variance"] == pytest.approx(PLANTED_BETWEEN, rel=0.1)
    assert v["within_share"] == pytest.approx(0.2, abs=0.02)
    p = np.repeat(np.where(rng.random(n) < 0.5, 0.2, 0.8), 4)
    b = variance_components((rng.random(n * 4) < p).astype(float), np.repeat(np.arange(n), 4))
    assert b["within_variance"] == pytest.approx(0.16, abs=0.01)
    assert b["between_variance"] == pytest.approx(0.09, abs=0.012)
    assert b["within_share"] == pytest.approx(0.16 / 0.25, abs=0.04)


def test_variance_components_match_r_aov():
    """The ANOVA estimators from R's one-way aov mean squares, with unequal samples per item."""
    from tests.support.rref import run_r

    rng = np.random.default_rng(10)
    sizes = rng.integers(1, 5, 40)
    item = np.repeat(np.arange(40), sizes)
    y = np.repeat(rng.normal(0, 1, 40), sizes) + rng.normal(0, 0.5, len(item))
    ref = run_r(
        """
        a <- summary(aov(y ~ factor(item), data = d))[[1]]
        N <- nrow(d); k <- table(d$item); n <- length(k)
        k0 <- (N - sum(k^2) / N) / (n - 1)
        emit("msw", a[["Mean Sq"]][2]); emit("between", max(0, (a[["Mean Sq"]][1] - a[["Mean Sq"]][2]) / k0))
    """,
        d=pd.DataFrame({"y": y, "item": item}),
    )
    v = variance_components(y, item)
    assert v["within_variance"] == pytest.approx(ref["msw"], rel=1e-10)
    assert v["between_variance"] == pytest.approx(ref["between"], rel=1e-10)


def test_variance_table_per_system_task_and_metric():
    rng = np.random.default_rng(11)
    desc = describe_answers(rng, 3, item_sd=2.0)
    acou = acoustic_repeats(rng, 3, np.sqrt(PLANTED_WITHIN), tasks=("readback",))
    table = between_sample_variance(s2s_items(pd.concat([desc, summaries(rng, 3)], ignore_index=True), acou))
    assert list(table["metric"]) == [
        "misgender_rate",
        "delta_composite",
        "delta_f0_median_st",
        "injection_rate",
        "p_she",
    ]
    assert list(table["task"]) == ["describe", "readback", "readback", "summarize", "summarize"]
    r = table.set_index("metric").loc["delta_f0_median_st"]
    assert r["n_items"] == 180 and r["n_answers"] == 540 and r["samples_per_item"] == 3.0
    assert r["within_variance"] == pytest.approx(PLANTED_WITHIN, rel=0.2)
    assert r["within_share"] == pytest.approx(r["within_variance"] / r["total_variance"])
    identical = between_sample_variance(s2s_items(repeat(desc[desc["sample"] == 0].drop(columns="sample"), 3), None))
    assert identical["within_variance"].item() == 0.0 and identical["within_share"].item() == 0.0


# ------------------------------------------------------------------ the bootstrap draws items


def test_bootstrap_resamples_items_with_their_samples():
    rng = np.random.default_rng(12)
    desc = describe_answers(rng, 3, item_sd=1.0)
    acou = acoustic_repeats(rng, 3, 0.5, tasks=("readback",))
    items = s2s_items(desc, acou)
    assert "sample" in items and len(items) > 3 * 170
    table = disaggregate(items, resamples=300, seed=1)
    # the same as the table of one value per item, the mean of its samples
    means = (
        items.groupby(["system", "task", "stimulus_id", "metric"], sort=False)
        .agg(
            {
                **{
                    c: "first"
                    for c in items.columns
                    if c not in ("system", "task", "stimulus_id", "metric", "sample", "value")
                },
                "value": "mean",
            }
        )
        .reset_index()
    )
    assert_frames_close(table, disaggregate(means[[c for c in items.columns if c != "sample"]], resamples=300, seed=1))
    en = table[(table["lang"] == "en") & (table["metric"] == "delta_composite")]
    assert set(en["n"]) == {10}  # 10 passages per pole x voice in one language: items, not answers


# ------------------------------------------------------------------ the stage


def test_analysis_stage_writes_the_variance_table_only_with_repeats(tmp_path):
    from voicebias.io import read_table, write_table
    from voicebias.pipeline.analysis import run_stage

    rng = np.random.default_rng(13)
    params = {"analyze": {"confidence": 0.95}}
    k3 = pd.concat([describe_answers(rng, 3), summaries(rng, 3)], ignore_index=True)
    write_table(tmp_path / "k3.csv", k3)
    write_table(tmp_path / "k3_ac.csv", acoustic_repeats(rng, 3, 0.3, tasks=("readback",)))
    out = tmp_path / "analysis"
    run_stage(params, scored_paths=[tmp_path / "k3.csv"], out_dir=out, acoustic_paths=[tmp_path / "k3_ac.csv"])
    variance = read_table(out / "repeats_variance.csv")
    assert set(variance["task"]) == {"describe", "summarize", "readback"}
    # p_she counts the summaries with one pronoun gender only
    assert (variance.loc[variance["metric"] != "p_she", "samples_per_item"] == 3).all()
    assert 1 < variance.loc[variance["metric"] == "p_she", "samples_per_item"].item() < 3
    rates = read_table(out / "describe_misgender.csv")
    assert rates.loc[rates["lang"] == "ALL", "n"].sum() == 180
    assert "test" in read_table(out / "describe_fisher.csv")
    # a later run without repeats empties the table (its columns, no rows)
    k1 = k3[k3["sample"] == 0].drop(columns="sample")
    write_table(tmp_path / "k1.csv", k1)
    run_stage(params, scored_paths=[tmp_path / "k1.csv"], out_dir=out)
    empty = read_table(out / "repeats_variance.csv")
    assert len(empty) == 0 and list(empty.columns) == list(variance.columns)
    assert "test" not in read_table(out / "describe_fisher.csv")


def test_repeats_module_examples():
    import doctest

    from voicebias.analysis import repeats

    result = doctest.testmod(repeats, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 3 and result.failed == 0
