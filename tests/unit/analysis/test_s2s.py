"""Analysis tables against hand computations on small tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from voicebias.analysis.s2s import describe_misgender, injection_controls, summarize_pronouns


def outputs(task: str, cells: dict) -> pd.DataFrame:
    """cells: {(lang, pole, voice): [pronoun_choice, ...]} -> scored rows of one system."""
    rows = []
    for (lang, pole, voice), choices in cells.items():
        for i, c in enumerate(choices):
            rows.append(
                {
                    "system": "s",
                    "task": task,
                    "lang": lang,
                    "pole": pole,
                    "voice_gender": voice,
                    "status": "ok",
                    "pronoun_choice": c,
                    "stimulus_id": f"{lang}-{pole}-{voice}-{i}",
                }
            )
    return pd.DataFrame(rows)


SUMMARIES = {
    ("en", "feminine", "male"): ["female", "female", "male", "both"],  # she 2/3 among single-gender
    ("en", "masculine", "male"): ["male", "male", "none", "none"],  # she 0/2
    ("en", "feminine", "female"): ["female", "female", "female", "both"],  # she 3/3
    ("en", "masculine", "female"): ["female", "male", "male", "male"],  # she 1/4
    ("en", "neutral", "male"): ["male", "none"],  # she 0/1
    ("en", "neutral", "female"): ["female", "both"],  # she 1/1
}


def test_summarize_pronouns_by_hand():
    df = pd.concat(
        [
            outputs("summarize", SUMMARIES),
            outputs("summarize", {("en", "neutral", "male"): ["female"]}).assign(status="failed"),
        ]
    )
    r = summarize_pronouns(df).iloc[0]
    # 20 ok summaries; 17 inject a gendered pronoun (both counts as injecting), 3 of them with both
    assert (r["n"], r["n_injecting"], r["n_both"]) == (20, 17, 3)
    assert r["injection_rate"] == pytest.approx(17 / 20)
    # P(she | pole): mean over the two voice cells of the share among single-gender injectors
    assert r["p_she_feminine"] == pytest.approx((2 / 3 + 3 / 3) / 2)
    assert r["p_she_masculine"] == pytest.approx((0 / 2 + 1 / 4) / 2)
    assert r["p_she_neutral"] == pytest.approx((0 + 1) / 2)
    # slopes in percentage points
    assert r["delta_pp"] == pytest.approx(100 * ((2 / 3 + 1) / 2 - (0 + 1 / 4) / 2))
    assert r["delta_pp_male_voice"] == pytest.approx(100 * (2 / 3 - 0))
    assert r["delta_pp_female_voice"] == pytest.approx(100 * (1 - 1 / 4))
    assert r["p_she_masculine_female_voice"] == pytest.approx(1 / 4)


def test_summarize_pronouns_by_language_and_injection_controls_use_one_rule():
    df = pd.concat(
        [
            outputs("summarize", SUMMARIES),
            outputs(
                "summarize",
                {("zh", "feminine", "male"): ["male", "none"], ("zh", "masculine", "male"): ["male", "male"]},
            ),
        ]
    )
    by_lang = summarize_pronouns(df, by_language=True).set_index("lang")
    assert by_lang.loc["zh", "n_injecting"] == 3 and by_lang.loc["zh", "injection_rate"] == pytest.approx(3 / 4)
    assert by_lang.loc["zh", "delta_pp"] == pytest.approx(0.0)
    assert by_lang.loc["en", "n_injecting"] == 17
    # the same outputs as paraphrases: the same injection count, 'both' included
    para = injection_controls(
        pd.concat(
            [outputs("paraphrase", SUMMARIES), outputs("paraphrase", {("zh", "feminine", "male"): ["male", "none"]})]
        )
    ).set_index("lang")
    assert para.loc["en", "n_injecting"] == 17 and para.loc["en", "injection_rate"] == pytest.approx(17 / 20)
    assert (para.loc["en", "n_he"], para.loc["en", "n_she"], para.loc["en", "n_both"]) == (7, 7, 3)
    assert para.loc["en", "n_injecting_feminine_content"] == 8 and para.loc["en", "n_injecting_masculine_content"] == 6
    assert para.loc["ALL", "n"] == 22 and para.loc["ALL", "n_injecting"] == 18


def test_describe_fisher_reports_each_voice_beside_the_pooled_test():
    rows = []
    for pole, voice, judged in [
        ("feminine", "male", ["female"] * 5 + ["male"] * 5),
        ("neutral", "male", ["male"] * 10),
        ("masculine", "female", ["male"] * 2 + ["female"] * 8),
        ("neutral", "female", ["male"] * 1 + ["female"] * 9),
    ]:
        rows += [
            {
                "system": "s",
                "task": "describe",
                "status": "ok",
                "lang": "zh",
                "pole": pole,
                "voice_gender": voice,
                "judged_gender": j,
            }
            for j in judged
        ]
    _, fisher = describe_misgender(pd.DataFrame(rows))
    f = fisher[fisher["lang"] == "zh"].set_index("voice_gender")
    assert list(f.index) == ["pooled", "male", "female"]
    assert (f.loc["male", "misaligned_misgendered"], f.loc["male", "neutral_misgendered"]) == (5, 0)
    assert (f.loc["female", "misaligned_misgendered"], f.loc["female", "neutral_misgendered"]) == (2, 1)
    assert (f.loc["pooled", "misaligned_misgendered"], f.loc["pooled", "misaligned_n"]) == (7, 20)
    # hypergeometric by hand: P(X = 5) for 5 misgendered among 20 with 10 drawn is C(10,5)/C(20,5); two-sided doubles it
    from math import comb

    assert f.loc["male", "p_value"] == pytest.approx(2 * comb(10, 5) / comb(20, 5))


def test_rq1_significance_counts_by_hand():
    from voicebias.analysis.rq1 import rq1_significance_counts

    contrasts = pd.DataFrame(
        {
            "system": ["a"] * 4,
            "measure": ["delta_composite"] * 4,
            "p_value": [0.01, 0.2, 0.04, 0.049],
            "signed_contrast": [0.3, 0.1, -0.2, 0.05],
        }
    )
    mixed = pd.DataFrame(
        {
            "system": ["a"] * 3,
            "measure": ["delta_composite"] * 3,
            "p_interaction": [0.03, 0.5, np.nan],
            "stereotype_effect_p": [0.001, 0.04, np.nan],
            "stereotype_effect_est": [0.5, -0.1, np.nan],
        }
    )
    r = rq1_significance_counts(contrasts, mixed).iloc[0]
    assert (r["n_cells"], r["n_cells_significant"], r["n_cells_toward"], r["n_cells_away"]) == (4, 3, 2, 1)
    assert (r["n_fits"], r["n_fits_interaction_significant"]) == (2, 1)
    assert (r["n_fits_stereotype_toward"], r["n_fits_stereotype_away"]) == (1, 1)


def test_planted_vs_recovered_reports_the_mixed_model_f0_effect_per_language():
    from tests.support.stats import deltas
    from voicebias.analysis.rq1 import rq1_mixed_models
    from voicebias.analysis.s2s import describe_odds_ratios, planted_vs_recovered

    ac = deltas(drift=2.0, seed=3, noise=0.3).assign(system="drifting")
    ac["delta_f0_median_st"] = ac["delta_composite"]
    rows = [
        {
            "system": "drifting",
            "task": "describe",
            "status": "ok",
            "lang": "en",
            "pole": p,
            "voice_gender": v,
            "judged_gender": j,
        }
        for p in ("masculine", "neutral", "feminine")
        for v in ("male", "female")
        for j in ("male", "female", "female")
    ]
    scored = pd.DataFrame(rows)
    rates, _ = describe_misgender(scored)
    truth = {"drifting": {"odds_ratio_per_step": 1.0, "misgender_rate": {}, "drift_st": 2.0}}
    pvr = planted_vs_recovered(
        describe_odds_ratios(scored), rates, truth, mixed=rq1_mixed_models(ac, "delta_f0_median_st")
    ).set_index("quantity")
    for lang in ("en", "es"):
        r = pvr.loc[f"rq1_f0_stereotype_effect_st_readback_{lang}"]
        assert r["planted"] == 2.0 and r["planted_in_ci"] and abs(r["recovered"] - 2.0) < 0.2


def test_compliance_table_by_hand():
    from voicebias.analysis.s2s import compliance

    rows = []
    for lang, task, status, judged in [
        ("en", "describe", "ok", "male"),
        ("en", "describe", "ok", "none"),
        ("en", "describe", "ok", "none"),
        ("en", "describe", "failed", None),
        ("en", "describe", "ok", "female"),
        ("zh", "describe", "ok", "female"),
        ("zh", "describe", "failed", "none"),
        ("en", "paraphrase", "ok", None),
        ("en", "paraphrase", "failed", None),
        ("en", "paraphrase", "ok", "none"),
        ("en", "describe", "excluded", None),
        ("en", "paraphrase", "excluded", None),
    ]:
        rows.append(
            {
                "system": "s",
                "lang": lang,
                "task": task,
                "status": status,
                "judged_gender": judged,
                "stimulus_id": f"{lang}-{len(rows)}",
            }
        )
    c = compliance(pd.DataFrame(rows)).set_index(["lang", "task"])
    assert list(c.columns) == ["system", "n", "failed", "excluded", "non_compliant"]
    # every call is counted; 'none' answers of ok describe calls are non-compliant, a failed call is not,
    # and a reply the screen excluded is counted as excluded, never as non-compliant
    assert tuple(c.loc[("en", "describe"), ["n", "failed", "excluded", "non_compliant"]]) == (6, 1, 1, 2)
    assert tuple(c.loc[("zh", "describe"), ["n", "failed", "excluded", "non_compliant"]]) == (2, 1, 0, 0)
    assert tuple(c.loc[("en", "paraphrase"), ["n", "failed", "excluded", "non_compliant"]]) == (4, 1, 1, 0)
    # non-compliance is a describe notion: other tasks report 0 whatever their judged column holds
    assert c.loc[("en", "paraphrase"), "non_compliant"] == 0


def test_injection_controls_count_ok_outputs_per_task_and_language_by_hand():
    df = pd.concat(
        [
            outputs(
                "paraphrase", {("en", "feminine", "male"): ["female", "none"], ("es", "masculine", "female"): ["male"]}
            ),
            outputs("translate", {("es", "feminine", "female"): ["both", "none", "none", "none"]}),
            outputs("paraphrase", {("en", "feminine", "male"): ["female", "female"]}).assign(status="failed"),
            outputs("summarize", {("en", "feminine", "male"): ["female"]}),
        ]
    )
    t = injection_controls(df).set_index(["task", "lang"])
    assert set(t.index) == {
        ("paraphrase", "ALL"),
        ("paraphrase", "en"),
        ("paraphrase", "es"),
        ("translate", "ALL"),
        ("translate", "es"),
    }
    # failed calls and summaries are not controls
    assert tuple(t.loc[("paraphrase", "ALL"), ["n", "n_injecting", "n_he", "n_she", "n_both"]]) == (3, 2, 1, 1, 0)
    assert t.loc[("paraphrase", "en"), "injection_rate"] == pytest.approx(1 / 2)
    assert t.loc[("paraphrase", "ALL"), "n_injecting_feminine_content"] == 1
    assert t.loc[("paraphrase", "ALL"), "n_injecting_masculine_content"] == 1
    assert tuple(t.loc[("translate", "es"), ["n", "n_injecting", "n_both"]]) == (4, 1, 1)
    assert t.loc[("translate", "es"), "injection_rate"] == pytest.approx(1 / 4)


def test_summarize_pronouns_without_single_gender_injections_has_no_slope():
    df = outputs(
        "summarize",
        {
            ("en", "feminine", "male"): ["both", "none"],
            ("en", "masculine", "male"): ["none"],
            ("en", "neutral", "male"): ["male"],
        },
    )
    r = summarize_pronouns(df).iloc[0]
    assert (r["n"], r["n_injecting"], r["n_both"]) == (4, 2, 1)
    assert r["injection_rate"] == pytest.approx(2 / 4)
    # no output commits to one gender on feminine or masculine content: no P(she) there, no slope
    assert np.isnan(r["p_she_feminine"]) and np.isnan(r["p_she_masculine"]) and np.isnan(r["delta_pp"])
    assert r["p_she_neutral"] == 0.0
