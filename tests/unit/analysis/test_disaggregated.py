"""The disaggregated table: closed-form estimates, calibrated bootstrap intervals, stable seeding.

What users rely on: every rate and mean by group equals the plain mean of its items, the
difference and ratio are against the named reference group, the intervals cover planted
values at about the nominal rate (checked on simulated data), a row's interval does not
move when another system joins the audit, and the item rules (compliance, the SC
comparison set) are those of the report's tables.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from voicebias import config
from voicebias.analysis.disaggregated import (
    COLUMNS,
    bootstrap_row,
    coverage_simulation,
    disaggregate,
    expanded_alpha,
    rate_coverage,
    rate_coverage_markdown,
    s2s_items,
    sc_items,
    score_row,
)


def describe_rows(system: str, judged: dict[tuple[str, str], list[str]]) -> pd.DataFrame:
    rows = []
    for (voice, pole), answers in judged.items():
        for i, a in enumerate(answers):
            rows.append(
                {
                    "system": system,
                    "task": "describe",
                    "stimulus_id": f"{system}-{voice}-{pole}-{i}",
                    "lang": "en",
                    "pole": pole,
                    "voice_gender": voice,
                    "status": "ok",
                    "judged_gender": a,
                    "pronoun_choice": np.nan,
                }
            )
    return pd.DataFrame(rows)


def test_expanded_alpha_matches_its_closed_form_and_tends_to_alpha():
    for n in (3, 10, 40):
        want = 2 * stats.norm.sf(np.sqrt(n / (n - 1)) * stats.t.ppf(0.975, n - 1))
        assert expanded_alpha(n, 0.95) == pytest.approx(want, rel=1e-12)
    assert expanded_alpha(100_000, 0.95) == pytest.approx(0.05, abs=1e-4)
    assert expanded_alpha(10, 0.95) < expanded_alpha(30, 0.95) < 0.05


def test_estimates_differences_and_ratios_are_the_closed_forms():
    judged = {
        ("male", "neutral"): ["male"] * 8 + ["female"] * 2,  # misgender 2/10
        ("male", "feminine"): ["male"] * 4 + ["female"] * 6,  # 6/10
        ("male", "masculine"): ["male"] * 9 + ["none"] * 1,  # 0/9, one non-compliant
        ("female", "neutral"): ["female"] * 5 + ["male"] * 5,  # 5/10
        ("female", "feminine"): ["female"] * 10,  # 0/10
        ("female", "masculine"): ["female"] * 3 + ["male"] * 7,
    }  # 7/10
    t = disaggregate(s2s_items(describe_rows("a", judged), None), resamples=500, seed=1)
    assert list(t.columns) == COLUMNS
    pole = t[(t["lang"] == "en") & (t["condition_factor"] == "content_pole")].set_index(["voice_gender", "condition"])
    assert pole.loc[("male", "feminine"), ["n", "estimate", "ref_estimate", "diff", "ratio"]].tolist() == pytest.approx(
        [10, 0.6, 0.2, 0.4, 3.0]
    )
    assert pole.loc[("male", "masculine"), "n"] == 9  # the answer naming no gender is not an item
    # 0 of 9: Wilson's interval keeps its width (0 to z^2 / (n + z^2))
    zero = pole.loc[("male", "masculine")]
    assert zero["estimate"] == 0 and zero["ci_method"] == "wilson" and zero["ci_low"] == 0.0
    assert zero["ci_high"] == pytest.approx(1.959963984540054**2 / (9 + 1.959963984540054**2), rel=1e-12)
    assert pole.loc[("male", "neutral"), "reference"] == "neutral" and pd.isna(pole.loc[("male", "neutral"), "diff"])
    # cell types pool both voices: aligned = (male, masculine) + (female, feminine) = 0/19
    cells = t[(t["lang"] == "en") & (t["condition_factor"] == "cell_type")].set_index("condition")
    assert cells.loc["aligned", ["n", "estimate"]].tolist() == [19, 0.0]
    assert cells.loc["misaligned", ["n", "estimate"]].tolist() == pytest.approx([20, 13 / 20])
    assert cells.loc["misaligned", "ratio"] == pytest.approx((13 / 20) / (7 / 20))
    assert cells.loc["aligned", "ratio"] == 0 and cells.loc["aligned", "diff"] == pytest.approx(-7 / 20)
    every = t[t["ci_method"].isin(["expanded percentile", "wilson"])]
    assert ((every["ci_low"] <= every["estimate"]) & (every["estimate"] <= every["ci_high"])).all()
    # every rate row: a score interval of positive width, its difference and ratio too (Newcombe, Koopman)
    rates = t[t["kind"] == "rate"]
    assert (rates["ci_method"] == "wilson").all() and (rates["ci_high"] > rates["ci_low"]).all()
    diffs = rates.dropna(subset=["diff"])
    assert (diffs["diff_ci_high"] > diffs["diff_ci_low"]).all()
    assert ((diffs["diff_ci_low"] <= diffs["diff"]) & (diffs["diff"] <= diffs["diff_ci_high"])).all()
    female = pole.loc[("female", "masculine")]  # 7/10 against 5/10
    from voicebias.analysis.intervals import koopman_ratio, newcombe_difference, wilson

    (l1, h1), (l2, h2) = wilson(7, 10), wilson(5, 10)
    assert [female["diff_ci_low"], female["diff_ci_high"]] == pytest.approx(
        list(newcombe_difference(0.7, l1, h1, 0.5, l2, h2)[1:]), rel=1e-12
    )
    assert [female["ratio_ci_low"], female["ratio_ci_high"]] == pytest.approx(list(koopman_ratio(7, 10, 5, 10)[1:]))


def test_ratio_to_a_zero_reference_is_not_given():
    r = bootstrap_row(np.array([1.0, 0, 1, 1]), np.zeros(4), np.random.default_rng(0), 300, 0.95, ratio=True)
    assert r["diff"] == 0.75 and np.isnan(r["ratio"]) and np.isnan(r["ratio_ci_low"])
    one = bootstrap_row(np.array([0.4]), None, np.random.default_rng(0), 300, 0.95, ratio=False)
    assert one["estimate"] == 0.4 and one["ci_method"] == "n<2" and np.isnan(one["ci_low"])
    r = score_row(np.array([1.0, 0, 1, 1]), np.zeros(4), 0.95, ratio=True)
    assert r["diff"] == 0.75 and r["diff_ci_high"] > r["diff_ci_low"] and np.isnan(r["ratio"])
    assert score_row(np.array([1.0]), None, 0.95, ratio=False)["ci_method"] == "n<2"


def test_rate_intervals_cover_at_the_nominal_rate_where_the_binomial_allows_it():
    """Exact coverage (rate_coverage) for rates 0.05-0.95 at 10 and 30 items: within 0.92-0.98, except
    a rate of 0.05 or 0.95 at 10 items, where no interval of the counts can: it covers with
    probability P(X <= 1) = 0.914 or at least P(X <= 2) = 0.988 (X ~ Binomial(10, 0.05))."""
    cov = rate_coverage()
    assert len(cov) == 30 and (cov["mean_width"] > 0).all()
    edge = (cov["n"] == 10) & cov["rate"].isin([0.05, 0.95]) & (cov["quantity"] == "rate")
    assert cov.loc[~edge, "coverage"].between(0.92, 0.98).all(), cov[~edge].to_string()
    assert cov.loc[edge, "coverage"].to_numpy() == pytest.approx(stats.binom.cdf(1, 10, 0.05), abs=1e-12)
    assert stats.binom.cdf(2, 10, 0.05) > 0.98
    text = (config.ROOT / "docs" / "disaggregated.md").read_text(encoding="utf-8")
    assert rate_coverage_markdown() in text, "docs/disaggregated.md: rerun rate_coverage_markdown()"


@pytest.mark.parametrize("n", [10, 30])
def test_intervals_cover_planted_values_at_about_the_nominal_rate(n):
    cov = coverage_simulation(runs=1000, n=n, seed=20260910, resamples=1000)
    # 1000 runs: a 95 % interval's coverage has a binomial SE of 0.007; the rate's score intervals
    # are checked exactly in test_rate_intervals_cover_at_the_nominal_rate_where_the_binomial_allows_it
    assert len(cov) == 5 and (cov["runs"] == 1000).all()
    means = cov[cov["setting"] == "normal mean"]
    assert len(means) == 2 and means["coverage"].between(0.93, 0.985).all(), cov.to_string()
    rates = cov[cov["setting"] == "rate"]
    assert rates["coverage"].between(0.9, 0.99).all(), cov.to_string()


def _mean_items(system: str, seed: int) -> pd.DataFrame:
    """delta_composite items of one system: 10 stimuli per voice x content pole."""
    rng = np.random.default_rng(seed)
    rows = [
        {
            "study": "s2s",
            "system": system,
            "task": "readback",
            "stimulus_id": f"{v}-{p}-{i}",
            "lang": "en",
            "condition": p,
            "voice_gender": v,
            "metric": "delta_composite",
            "value": float(rng.normal()),
            "condition_factor": "content_pole",
        }
        for v in ("male", "female")
        for p in ("neutral", "feminine", "masculine")
        for i in range(10)
    ]
    return pd.DataFrame(rows)


def test_rows_are_seeded_by_their_key_so_adding_a_system_leaves_them_unchanged():
    a = _mean_items("a", 1)
    alone = disaggregate(a, resamples=400, seed=9)
    again = disaggregate(a, resamples=400, seed=9)
    pd.testing.assert_frame_equal(alone, again)
    both = disaggregate(pd.concat([_mean_items("b", 2), a], ignore_index=True), resamples=400, seed=9)
    pd.testing.assert_frame_equal(both[both["system"] == "a"].reset_index(drop=True), alone)
    other_seed = disaggregate(a, resamples=400, seed=10)
    assert not np.allclose(other_seed["ci_low"].to_numpy(float), alone["ci_low"].to_numpy(float), equal_nan=True)
    # rates draw nothing: their score intervals are the same under any seed
    judged = {
        (v, p): (["male", "female"] * 5) for v in ("male", "female") for p in ("neutral", "feminine", "masculine")
    }
    items = s2s_items(describe_rows("a", judged), None)
    pd.testing.assert_frame_equal(disaggregate(items, seed=9), disaggregate(items, seed=10))


def test_summarize_items_follow_the_pronoun_rule_and_describe_rows_carry_no_acoustics():
    s = pd.DataFrame(
        {
            "system": "a",
            "task": "summarize",
            "stimulus_id": [f"s{i}" for i in range(6)],
            "lang": "en",
            "pole": "feminine",
            "voice_gender": "male",
            "status": ["ok"] * 5 + ["failed"],
            "judged_gender": np.nan,
            "pronoun_choice": ["female", "female", "male", "both", "none", "female"],
        }
    )
    acoustic = pd.DataFrame(
        {
            "system": "a",
            "task": ["describe", "readback"],
            "stimulus_id": ["d0", "r0"],
            "lang": "en",
            "pole": "neutral",
            "voice_gender": "male",
            "status": "ok",
            "delta_composite": [5.0, 0.25],
        }
    )
    items = s2s_items(s, acoustic)
    by = items.groupby("metric")["value"].agg(["size", "mean"])
    assert by.loc["injection_rate"].tolist() == [5, 4 / 5]  # "both" injects; the failed call is no item
    assert by.loc["p_she"].tolist() == pytest.approx([3, 2 / 3])  # among one-gender summaries only
    assert by.loc["delta_composite"].tolist() == [1, 0.25]  # describe is not acoustically scored


def test_sc_items_use_the_stimuli_every_system_continued_and_match_the_similarity_table():
    from voicebias.analysis.sc_stats import all_systems_succeeded, similarity_table

    rng = np.random.default_rng(4)
    rows = []
    for system in ("x", "y"):
        for i in range(24):
            rows.append(
                {
                    "system": system,
                    "stimulus_id": f"p{i}",
                    "lang": "en",
                    "phonation": ("modal", "breathy")[i % 2],
                    "voice_gender": ("male", "female")[(i // 2) % 2],
                    "status": "failed" if (system, i) == ("y", 3) else "ok",
                    "measure_status": "ok",
                    "judge_status": "ok",
                    "speaker_similarity": rng.uniform(0.3, 0.9),
                    "h1_h2_db": rng.normal(5, 2),
                    "semantic_coherence": rng.integers(1, 6),
                }
            )
    scored = pd.DataFrame(rows)
    items = sc_items(scored)
    assert "p3" not in set(items["stimulus_id"])  # y failed on p3: x's continuation of it is left out too
    t = disaggregate(items, resamples=300, seed=2)
    sim = similarity_table(all_systems_succeeded(scored))
    got = t[(t["metric"] == "speaker_similarity") & (t["lang"] == "en") & (t["condition"] != "all")]
    merged = got.merge(
        sim, left_on=["system", "condition", "voice_gender"], right_on=["system", "phonation", "voice_gender"]
    )
    assert len(merged) == len(sim) == 8
    np.testing.assert_allclose(merged["estimate"], merged["mean"], rtol=1e-12)
    assert (merged["n_x"] == merged["n_y"]).all()
    breathy = got[got["condition"] == "breathy"]
    assert (breathy["reference"] == "modal").all() and breathy["diff"].notna().all()
