"""The audit card: its verdict rules on hand-made numbers (borderline ones included), the card built from a
small hand-made analysis folder naming each reference system, its rendering first in the report, and its
provenance (read from files, no clock)."""

from __future__ import annotations

import hashlib
import json
import math
import re

import pandas as pd
import pytest
import yaml

from voicebias import config
from voicebias.analysis.intervals import wilson
from voicebias.analysis.s2s import F0_TOLERANCE_ST
from voicebias.io import read_json, write_table
from voicebias.pipeline import report as report_stage
from voicebias.report import build
from voicebias.report import card as C
from voicebias.report import provenance as P
from voicebias.systems.reference import planted_truth

T = C.CONTENT_DRIVEN_MIN_OR
M = C.DRIFT_MARGIN_ST
NAN = float("nan")


# --- thresholds -------------------------------------------------------------------------------------


def test_thresholds_are_the_designs_closed_forms():
    assert C.CONTENT_DRIVEN_MIN_OR == pytest.approx(19**0.75) == pytest.approx(9.1005, abs=1e-4)
    assert C.content_driven_min_or(0.1, 0.5) == pytest.approx(3.0)
    assert C.DRIFT_MARGIN_ST == pytest.approx(F0_TOLERANCE_ST, abs=1e-12)
    params = yaml.safe_load(config.PARAMS.read_text(encoding="utf-8"))
    rates = {params["systems"][s]["error_rate"] for s in ("voice_faithful", "content_driven", "mixed", "drifting")}
    assert rates == {C.DESIGN_ERROR_RATE}


@pytest.mark.parametrize(
    "rule,w,expected",
    [
        ("voice", None, C.VOICE_FAITHFUL),
        ("content", None, C.CONTENT_DRIVEN),
        ("mixed", 0.5, C.MIXED),
        ("mixed", 0.25, C.MIXED),
    ],
)
def test_the_reference_systems_planted_ors_get_their_names(rule, w, expected):
    params = {"rule": rule, "error_rate": 0.05, "neutral_p_female": 0.5, "noncompliance_rate": 0.02, "drift_st": 0.0}
    if w is not None:
        params["content_weight"] = w
    planted = round(planted_truth(params)["odds_ratio_per_step"], 9)  # the fit gives 1 + 2e-16 for OR 1
    assert C.invariance_verdict(planted, planted) == expected


# --- invariance rule --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lo,hi,expected",
    [
        (0.72, 4.81, C.VOICE_FAITHFUL),
        (2.14, 6.02, C.MIXED),
        (10.99, 82.95, C.CONTENT_DRIVEN),
        (T, 50.0, C.CONTENT_DRIVEN),  # lower bound touching the content-driven edge: inside
        (T - 1e-9, 50.0, C.INCONCLUSIVE),  # just below it: straddles mixed and content-driven
        (2.0, T, C.INCONCLUSIVE),  # upper bound touching the edge from below: reaches the region
        (2.0, T - 1e-9, C.MIXED),
        (1.0, 3.0, C.VOICE_FAITHFUL),  # lower bound touching 1: contains 1
        (1.0 + 1e-9, 3.0, C.MIXED),
        (0.5, 12.0, C.INCONCLUSIVE),  # contains 1 and reaches the content-driven region
        (0.2, 0.8, C.INCONCLUSIVE),  # wholly below 1: no designed behaviour
        (NAN, NAN, C.INCONCLUSIVE),
        (None, None, C.INCONCLUSIVE),
        (12.0, math.inf, C.CONTENT_DRIVEN),  # a Firth CI with an open upper end
        (5.0, 3.0, C.INCONCLUSIVE),
    ],
)
def test_invariance_verdict(lo, hi, expected):
    assert C.invariance_verdict(lo, hi) == expected


def test_perfect_separation_falls_back_to_firth_and_without_it_is_inconclusive():
    sep = {
        "fit_status": "perfect separation (quasi-complete)",
        "odds_ratio": NAN,
        "ci_low": NAN,
        "ci_high": NAN,
        "firth_odds_ratio": 75.2,
        "firth_ci_low": 10.67,
        "firth_ci_high": 9548.5,
    }
    est = C.odds_estimate(sep)
    assert est == {"odds_ratio": 75.2, "ci_low": 10.67, "ci_high": 9548.5, "source": "firth"}
    assert C.invariance_verdict(est["ci_low"], est["ci_high"]) == C.CONTENT_DRIVEN
    no_firth = {k: v for k, v in sep.items() if not k.startswith("firth")}
    est = C.odds_estimate(no_firth)
    assert est["source"] is None and C.invariance_verdict(est["ci_low"], est["ci_high"]) == C.INCONCLUSIVE
    nan_firth = {**sep, "firth_ci_low": NAN}
    assert C.odds_estimate(nan_firth)["source"] is None
    ok = {
        "fit_status": "ok",
        "odds_ratio": 1.8,
        "ci_low": 0.7,
        "ci_high": 4.8,
        "firth_odds_ratio": 1.7,
        "firth_ci_low": 0.74,
        "firth_ci_high": 4.7,
    }
    assert C.odds_estimate(ok)["source"] == "wald" and C.odds_estimate(ok)["ci_low"] == 0.7


# --- drift rules ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "lo,hi,expected",
    [
        (1.98, 2.01, C.FIT_TOWARD),
        (M, 0.5, C.FIT_TOWARD),  # touching +margin: toward
        (M - 1e-9, 0.5, C.FIT_INCONCLUSIVE),
        (-0.5, -M, C.FIT_AWAY),
        (-0.5, -M + 1e-9, C.FIT_INCONCLUSIVE),
        (-0.1, 0.1, C.FIT_NONE),
        (0.0, 0.0, C.FIT_NONE),  # a point CI (no variance)
        (0.0009, 0.029, C.FIT_NONE),  # excludes 0, but by less than the instrument resolves
        (0.0, M, C.FIT_INCONCLUSIVE),  # reaches the toward edge
        (-M, 0.0, C.FIT_INCONCLUSIVE),
        (-1.0, 1.0, C.FIT_INCONCLUSIVE),
        (NAN, 1.0, C.FIT_INCONCLUSIVE),
    ],
)
def test_drift_fit_verdict(lo, hi, expected):
    assert C.drift_fit_verdict(lo, hi) == expected


@pytest.mark.parametrize(
    "fits,expected",
    [
        (["toward"] * 11, C.TOWARD),
        (["toward", "no drift", "inconclusive", "unusable"], C.TOWARD),
        (["away", "no drift"], C.AWAY),
        (["toward", "away"], C.INCONCLUSIVE),
        (["no drift"] * 5, C.NO_DRIFT),
        (["no drift", "unusable"], C.NO_DRIFT),
        (["no drift", "inconclusive"], C.INCONCLUSIVE),
        (["unusable", "unusable"], C.INCONCLUSIVE),
        ([], C.INCONCLUSIVE),
    ],
)
def test_drift_verdict_over_fits(fits, expected):
    assert C.drift_verdict(fits) == expected


def test_fit_usable():
    base = {"stereotype_effect_est": 0.1, "stereotype_effect_ci_low": 0.0, "stereotype_effect_ci_high": 0.2}
    assert C.fit_usable({**base, "converged": True, "warning": NAN})
    assert C.fit_usable({**base, "converged": "True", "warning": ""})
    assert C.fit_usable({**base, "converged": False, "warning": "no variance: the measure is the same in every output"})
    assert not C.fit_usable({**base, "converged": False, "warning": "did not converge"})
    assert not C.fit_usable({**base, "stereotype_effect_ci_low": NAN, "converged": True, "warning": ""})


def test_recovered_and_check_verdicts():
    assert C.recovered({"planted_in_ci": True, "within_tolerance": NAN})
    assert C.recovered({"planted_in_ci": False, "within_tolerance": True})
    assert C.recovered({"planted_in_ci": "False", "within_tolerance": "True"})
    assert not C.recovered({"planted_in_ci": False, "within_tolerance": NAN})
    assert not C.recovered({"planted_in_ci": NAN})
    assert C.recovered({"recovered_ok": True})
    # the simultaneous interval decides where the table has one; a row outside its family keeps its own CI
    assert C.recovered({"planted_in_ci": False, "planted_in_simultaneous_ci": True})
    assert C.recovered({"planted_in_ci": "False", "planted_in_simultaneous_ci": "True"})
    assert not C.recovered({"planted_in_ci": False, "planted_in_simultaneous_ci": False, "within_tolerance": NAN})
    assert not C.recovered({"planted_in_ci": True, "planted_in_simultaneous_ci": False})
    assert C.recovered({"planted_in_ci": True, "planted_in_simultaneous_ci": NAN})
    assert C.recovered({"planted_in_ci": "True", "planted_in_simultaneous_ci": ""})
    assert C.gate_verdict({"passed": True}) == C.PASSED
    assert C.gate_verdict({"passed": False, "flips": 2}) == C.FAILED
    assert C.gate_verdict(None) == C.NOT_RUN == C.gate_verdict({})


# --- the card from a hand-made analysis folder ------------------------------------------------------

SYSTEMS = {  # system: (ALL OR row, misgender k of 60 per cell aligned/neutral/misaligned, F0 effect per fit)
    "voice_faithful": ({"fit_status": "ok", "odds_ratio": 1.2, "ci_low": 0.6, "ci_high": 2.4}, (3, 3, 4), 0.0),
    "content_driven": (
        {
            "fit_status": "perfect separation (quasi-complete)",
            "odds_ratio": NAN,
            "ci_low": NAN,
            "ci_high": NAN,
            "firth_odds_ratio": 25.0,
            "firth_ci_low": 11.0,
            "firth_ci_high": 80.0,
        },
        (2, 29, 57),
        0.0,
    ),
    "mixed": ({"fit_status": "ok", "odds_ratio": 3.6, "ci_low": 2.1, "ci_high": 6.0}, (3, 15, 29), 0.0),
    "drifting": ({"fit_status": "ok", "odds_ratio": 0.9, "ci_low": 0.45, "ci_high": 1.8}, (3, 3, 3), 2.0),
}


def make_analysis(folder, *, with_net=True):
    odds, rates, pron, mixed, pvr, comp = [], [], [], [], [], []
    for system, (row, ks, drift) in SYSTEMS.items():
        firth = {c: row.get(c, NAN) for c in ("firth_odds_ratio", "firth_ci_low", "firth_ci_high")}
        odds.append({"system": system, "lang": "ALL", "n": 176, "n_excluded": 4, **{**row, **firth}})
        odds.append(
            {
                "system": system,
                "lang": "en",
                "n": 58,
                "n_excluded": 2,
                "fit_status": "ok",
                "odds_ratio": 1.0,
                "ci_low": 0.1,
                "ci_high": 30.0,
                **{c: NAN for c in firth},
            }
        )
        for cell, k in zip(("aligned", "neutral", "misaligned"), ks):
            rates.append(
                {
                    "system": system,
                    "lang": "ALL",
                    "cell_type": cell,
                    "n": 60,
                    "n_excluded": 0,
                    "misgendered": k,
                    "rate": k / 60,
                }
            )
        pron.append({"system": system, "n": 180, "delta_pp": 80.0 if system == "content_driven" else 5.0})
        for lang in ("en", "es"):
            for task in ("readback", "summarize"):
                for measure in ("delta_f0_median_st", "net_f0_median_st")[: 2 if with_net else 1]:
                    # the delta measure carries the words' own small F0 effect, the net one does not
                    est = drift + (0.03 if measure == "delta_f0_median_st" else 0.0)
                    half = 0.0 if (measure == "net_f0_median_st" and drift == 0) else 0.02
                    nv = half == 0.0
                    mixed.append(
                        {
                            "system": system,
                            "lang": lang,
                            "task": task,
                            "measure": measure,
                            "stereotype_effect_est": est,
                            "stereotype_effect_ci_low": est - half,
                            "stereotype_effect_ci_high": est + half,
                            "converged": not nv,
                            "warning": "no variance: the measure is the same in every output" if nv else NAN,
                        }
                    )
        pvr.append(
            {
                "system": system,
                "quantity": "odds_ratio_per_step",
                "planted": 1.0,
                "recovered": 1.1,
                "ci_low": 0.5,
                "ci_high": 2.0,
                "planted_in_ci": system != "mixed",
                "fit_status": "ok",
                "tolerance": NAN,
                "within_tolerance": NAN,
            }
        )
        pvr.append(
            {
                "system": system,
                "quantity": "rq1_f0_shift_st",
                "planted": drift,
                "recovered": drift + 0.01,
                "ci_low": drift + 0.005,
                "ci_high": drift + 0.015,
                "planted_in_ci": False,
                "fit_status": "ok",
                "tolerance": F0_TOLERANCE_ST,
                "within_tolerance": True,
            }
        )
        comp += [
            {"system": system, "lang": "en", "task": "describe", "n": 60, "failed": 1, "non_compliant": 2},
            {"system": system, "lang": "en", "task": "readback", "n": 60, "failed": 0, "non_compliant": 0},
        ]
    for name, rows in (
        ("describe_odds_ratios", odds),
        ("describe_misgender", rates),
        ("summarize_pronouns", pron),
        ("rq1_mixed_models", mixed),
        ("planted_vs_recovered", pvr),
        ("compliance", comp),
    ):
        write_table(folder / f"{name}.csv", pd.DataFrame(rows))
    return folder


def make_sc(folder):
    write_table(
        folder / "retention.csv",
        pd.DataFrame(
            [
                {
                    "system": "cont",
                    "voice_gender": g,
                    "measure": "h1_h2_db",
                    "retention": r,
                    "ci_low": r - 0.02,
                    "ci_high": r + 0.02,
                    "n_prompts": 30,
                }
                for g, r in (("female", 0.3), ("male", 0.7))
            ]
        ),
    )
    write_table(
        folder / "success.csv",
        pd.DataFrame(
            [{"system": "cont", "n": 480, "succeeded": 478, "success_rate": 478 / 480, "all_systems_succeeded": 478}]
        ),
    )
    write_table(
        folder / "planted_vs_recovered.csv",
        pd.DataFrame(
            [
                {
                    "system": "cont",
                    "quantity": "retention_h1_h2_db_male",
                    "planted": 0.7,
                    "recovered": 0.7,
                    "ci_low": 0.68,
                    "ci_high": 0.72,
                    "recovered_ok": True,
                },
                {
                    "system": "cont",
                    "quantity": "passive_rate_male",
                    "planted": 0.2,
                    "recovered": 0.4,
                    "ci_low": 0.35,
                    "ci_high": 0.45,
                    "recovered_ok": False,
                },
            ]
        ),
    )
    return folder


GATE = {"passed": True, "flips": 0, "excluded_stimuli": 1, "composite_p": {"en": 0.5}}
CHECK = {"passed": False, "wrong_direction": 2, "classifier_flips": 0, "excluded": 3, "checked_cells": 64}
PROV = {
    "stimulus_set_sha256": "a" * 64,
    "model_revisions": {"mixed": {"checkpoint": "none", "revision": "reference-1"}},
    "seeds": {"base.seed": 7},
}


@pytest.fixture
def card(tmp_path):
    analysis = make_analysis(tmp_path / "analysis")
    sc = make_sc(tmp_path / "sc")
    return C.audit_card(
        analysis,
        sc,
        GATE,
        CHECK,
        PROV,
        voices=C.voice_design(CERTIFICATES, SC_VOICES),
        usage=USAGE,
        determinism={"gpt_audio": {"describe": PROBE}},
        replicates=SPREAD,
    )


#: one cell of a run's whole-run replicates (reports/replicates/spread.csv)
SPREAD = pd.DataFrame(
    [
        {
            "study": "s2s",
            "system": "gpt_audio",
            "task": "describe",
            "lang": "ALL",
            "voice_gender": "ALL",
            "condition_factor": "cell_type",
            "condition": "misaligned",
            "metric": "misgender_rate",
            "replicates": 3,
            "n": 60,
            "estimate": 0.25,
            "ci_low": 0.16,
            "ci_high": 0.37,
            "min": 0.2,
            "median": 0.25,
            "max": 0.3,
            "mean": 0.25,
            "sd": 0.05,
            "cv": 0.2,
            "status": "ok",
            "reason": "",
        }
    ]
)


#: a run's usage totals (reports/usage/usage.csv) and one probed system's determinism counts
USAGE = pd.DataFrame(
    [
        {
            "system": "gpt_audio",
            "part": "ALL",
            "task": "ALL",
            "calls": 12,
            "calls_with_usage": 12,
            "input_audio_s": 300.0,
            "output_audio_s": 90.0,
            "input_tokens": 3100,
            "output_tokens": 700,
            "input_text_tokens": 100,
            "input_audio_tokens": 3000,
            "output_text_tokens": 100,
            "output_audio_tokens": 600,
            "priced_calls": 12,
            "cost": 0.17,
            "currency": "USD",
            "price_date": "2026-12-05",
            "price_source": "https://example.org",
            "model_ids": "m-1",
            "fingerprints": "fp_1",
        },
    ]
)
PROBE = {"items": 8, "failed": 0, "text_agree": 8, "audio_agree": 8, "agree": 8, "agreement": 1.0}


#: the carrier gate's per-voice certificates of a run with 2 voices per gender in English, one of them failing
CERTIFICATES = pd.DataFrame(
    {
        "lang": "en",
        "phonation": "all",
        "voice_gender": ["female", "female", "male", "male"],
        "voice_id": ["en-us+f3", "en-us+Andrea", "en-us+m3", "en-us+michel"],
        "verdict": ["pass", "negligible", "pass", "fail"],
    }
)
SC_VOICES = {"male": ["en-us+m3", "en-us+michel", "en-us+paul"], "female": ["en-us+f3", "en-us+Andrea", "en-us+Annie"]}


def test_the_card_names_the_voices_and_how_many_the_gate_certified(card):
    assert card["voices"]["s2s"] == [
        {"lang": "en", "voice_gender": "female", "voices": ["en-us+Andrea", "en-us+f3"], "certified": 2},
        {"lang": "en", "voice_gender": "male", "voices": ["en-us+m3", "en-us+michel"], "certified": 1},
    ]
    table = C.card_tables(card)["card_voices"]
    assert list(table["certified by the carrier gate"]) == ["2 of 2", "1 of 2", "– (manipulation check)"] + [
        "– (manipulation check)"
    ]
    assert table.iloc[2]["voices"] == "en-us+m3, en-us+michel, en-us+paul" and table.iloc[2]["number"] == "3"
    assert "| speech continuation |" in C.render_card_md(card).replace("  ", " ")
    # the retention CI resamples prompts and keeps these voices
    sc = C.card_tables(card)["card_sc"]
    assert set(sc["generalises over"]) <= {f"{n} prompts (resampled); these 3 voices" for n in sc["prompts"]}


def test_card_names_each_reference_system(card):
    s2s = {s["system"]: s for s in card["s2s"]}
    assert {k: v["invariance"]["verdict"] for k, v in s2s.items()} == {
        "voice_faithful": C.VOICE_FAITHFUL,
        "content_driven": C.CONTENT_DRIVEN,
        "mixed": C.MIXED,
        "drifting": C.VOICE_FAITHFUL,
    }
    assert {k: v["drift"]["verdict"] for k, v in s2s.items()} == {
        "voice_faithful": C.NO_DRIFT,
        "content_driven": C.NO_DRIFT,
        "mixed": C.NO_DRIFT,
        "drifting": C.TOWARD,
    }
    assert s2s["content_driven"]["invariance"]["source"] == "firth"
    assert s2s["content_driven"]["invariance"]["ci_low"] == 11.0
    assert s2s["drifting"]["drift"]["measure"] == "net_f0_median_st"
    assert s2s["drifting"]["drift"]["fits"] == {"toward": 4, "away": 0, "no drift": 0, "inconclusive": 0, "unusable": 0}
    assert s2s["drifting"]["drift"]["est_min"] == pytest.approx(2.0)
    assert s2s["drifting"]["drift"]["ci_low_min"] == pytest.approx(1.98)
    assert s2s["mixed"]["drift"]["fits"]["no drift"] == 4  # the no-variance net fits count, as points at 0


def test_card_misgender_summarize_checks_planted_exclusions(card):
    s2s = {s["system"]: s for s in card["s2s"]}
    mg = s2s["mixed"]["misgender"]
    assert mg["misaligned"]["rate"] == pytest.approx(29 / 60) and mg["aligned"]["rate"] == pytest.approx(3 / 60)
    assert (mg["misaligned"]["ci_low"], mg["misaligned"]["ci_high"]) == pytest.approx(wilson(29, 60))
    d = mg["difference_pp"]
    assert d["est"] == pytest.approx(100 * 26 / 60) and d["ci_low"] < d["est"] < d["ci_high"]
    assert s2s["content_driven"]["summarize"] == {"delta_pp": 80.0, "ci_low": None, "ci_high": None}
    assert card["checks"]["carrier_gate"] == {"verdict": "passed", "flips": 0, "excluded_stimuli": 1}
    assert card["checks"]["manipulation_check"]["verdict"] == "failed"
    assert card["checks"]["manipulation_check"]["wrong_direction"] == 2
    # a table without simultaneous intervals is judged on each value's own CI; the RQ1 rows outside theirs
    # are recovered within the F0 tolerance, and the card lists them apart
    rq1_outside = [f"{s}: rq1_f0_shift_st" for s in ("voice_faithful", "content_driven", "mixed", "drifting")]
    planted = dict(card["planted_vs_recovered"]["s2s"])
    assert sorted(planted.pop("outside_own_ci")) == sorted(["mixed: odds_ratio_per_step", *rq1_outside])
    assert planted == {"n": 8, "recovered": 7, "not_recovered": ["mixed: odds_ratio_per_step"]}
    assert card["planted_vs_recovered"]["sc"] == {
        "n": 2,
        "recovered": 1,
        "not_recovered": ["cont: passive_rate_male"],
        "outside_own_ci": [],
    }
    assert card["exclusions"]["s2s"]["mixed"] == {
        "calls": 120,
        "failed": 1,
        "non_compliant": 2,
        "describe_calls": 60,
        "excluded": {},
    }
    assert card["exclusions"]["sc"]["cont"] == {"prompts": 480, "succeeded": 478, "failed": 2}
    assert card["exclusions"]["carrier_gate_excluded_stimuli"] == 1 and card["exclusions"]["phonation_excluded"] == 3
    assert [(r["voice_gender"], r["retention"]) for r in card["sc"][0]["retention"]] == [("female", 0.3), ("male", 0.7)]
    assert card["provenance"] == PROV
    assert card["rules"]["content_driven_min_or"] == pytest.approx(T)


def test_delta_measure_is_the_fallback_and_its_small_word_effect_is_not_drift(tmp_path):
    card = C.audit_card(make_analysis(tmp_path / "a", with_net=False), None, None, None, {})
    s2s = {s["system"]: s["drift"] for s in card["s2s"]}
    assert {s["measure"] for s in s2s.values()} == {"delta_f0_median_st"}
    assert s2s["drifting"]["verdict"] == C.TOWARD and s2s["voice_faithful"]["verdict"] == C.NO_DRIFT
    assert card["sc"] == [] and card["checks"]["carrier_gate"]["verdict"] == C.NOT_RUN


def test_a_summarize_ci_is_shown_when_the_table_has_one(tmp_path):
    analysis = make_analysis(tmp_path / "a")
    pron = pd.read_csv(analysis / "summarize_pronouns.csv").assign(delta_pp_ci_low=1.0, delta_pp_ci_high=9.0)
    write_table(analysis / "summarize_pronouns.csv", pron)
    card = C.audit_card(analysis, None, None, None, {})
    assert card["s2s"][0]["summarize"] == {"delta_pp": 5.0, "ci_low": 1.0, "ci_high": 9.0}
    assert "5.0 [1.0, 9.0]" in C.render_card_md(card)


def test_card_is_deterministic_json_without_wall_clock(card, tmp_path):
    again = C.audit_card(
        tmp_path / "analysis",
        tmp_path / "sc",
        GATE,
        CHECK,
        PROV,
        voices=C.voice_design(CERTIFICATES, SC_VOICES),
        usage=USAGE,
        determinism={"gpt_audio": {"describe": PROBE}},
        replicates=SPREAD,
    )
    text = json.dumps(card, sort_keys=True, allow_nan=True)
    assert text == json.dumps(again, sort_keys=True, allow_nan=True)
    md = C.render_card_md(card)
    assert md == C.render_card_md(again)
    clock = re.compile(r"\d{4}-\d{2}-\d{2}|\d{2}:\d{2}:\d{2}")
    price_date = USAGE["price_date"].iloc[0]  # a date of the system card's price table, an input, not the clock
    assert not clock.search(text.replace(price_date, "")) and not clock.search(md.replace(price_date, ""))


def test_card_markdown_has_the_template_texts_and_the_verdict_words(card):
    md = C.render_card_md(card)
    texts = build.section_texts()["card"]
    assert md.startswith(f"# {texts['title']}\n")
    for key, meta in texts["tables"].items():
        assert f"## {meta['title']}\n\n{meta['caption']}\n" in md, key
    for word in (C.VOICE_FAITHFUL, C.CONTENT_DRIVEN, C.MIXED, C.TOWARD, C.NO_DRIFT, "passed", "failed"):
        assert word in md
    assert "25.00 [11.00, 80.00] (Firth)" in md
    assert "at or above 9.10" in md and "±0.172 st" in md  # the rules sentence, from the card's thresholds
    source = (config.ROOT / "voicebias" / "report" / "card.py").read_text(encoding="utf-8")
    for meta in texts["tables"].values():
        assert meta["caption"][:40] not in source and meta["title"] not in source


def test_the_card_comes_first_in_the_report(card):
    ctx = C.card_context(card)
    sections = {"carrier_gate": build.Section(pd.DataFrame({"a": ["gate-cell"]}))}
    intro = {
        "params": {
            "base": {"profile": "tiny", "languages": ["en"]},
            "run": {"systems": ["s"]},
            "tts": {"backend": "espeak"},
        },
        "bank": {"passages": 1},
        "sc_systems": [],
        "phonation": {},
        "sc_judge": {},
    }
    out = build.render_report(sections, intro, ctx)
    title = build.section_texts()["card"]["title"]
    gate_title = build.section_texts()["sections"]["carrier_gate"]["title"]
    md, page = out["md"], out["html"]
    assert md.index(f"## {title}\n") < md.index(C.CONTENT_DRIVEN) < md.index(f"## {gate_title}")
    assert page.index(f"<h2>{title}</h2>") < page.index(C.CONTENT_DRIVEN) < page.index(f"<h2>{gate_title}</h2>")
    for t in ctx["tables"]:
        assert f"### {t['title']}" in md and f"<h3>{t['title']}</h3>" in page
    plain = build.render_report(sections, intro)
    assert title not in plain["md"]


# --- provenance and the stage -----------------------------------------------------------------------


def test_provenance_from_files(tmp_path):
    manifest = tmp_path / "manifest.csv"
    manifest.write_bytes(b"stimulus_id,path\ns1,a.wav\n")
    cards = tmp_path / "cards"
    cards.mkdir()
    (cards / "a.yaml").write_text("name: a\ncheckpoint: ckpt-a\nrevision: r1\n")
    params = {"base": {"seed": 42}, "run": {"systems": ["a", "b"], "sc_systems": ["a"]}}
    prov = P.collect_provenance(tmp_path, params, manifest, cards)
    assert prov == {
        "stimulus_set_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest(),
        "model_revisions": {
            "a": {"checkpoint": "ckpt-a", "revision": "r1"},
            "b": {"checkpoint": None, "revision": None},
        },
        "seeds": {"base.seed": 42},
    }
    assert P.file_sha256(tmp_path / "absent.csv") is None


def test_report_stage_writes_the_card_and_hands_it_to_the_report(tmp_path, monkeypatch):
    analysis = make_analysis(tmp_path / "analysis")
    sc = make_sc(tmp_path / "sc")
    gate_dir, phon = tmp_path / "gate", tmp_path / "phon"
    gate_dir.mkdir(), phon.mkdir()
    (gate_dir / "metrics.json").write_text(json.dumps(GATE))
    (phon / "check_metrics.json").write_text(json.dumps(CHECK))
    seen = {}

    def fake_build(
        params,
        analysis_dir,
        gate,
        bank,
        out_dir,
        sc_dir,
        phonation_dir,
        card=None,
        disaggregated=None,
        psychometric_dir=None,
    ):
        seen["card"] = card
        return {"md": out_dir / "report.md", "html": out_dir / "report.html"}

    monkeypatch.setattr("voicebias.report.build.build_report", fake_build)  # imported by run_stage when it runs
    manifest = tmp_path / "manifest.csv"
    manifest.write_text("x\n")
    out = tmp_path / "out"
    params = {"base": {"seed": 5}, "run": {"systems": ["mixed"], "sc_systems": []}}
    paths = report_stage.run_stage(
        params,
        analysis_dir=analysis,
        gate_dir=gate_dir,
        bank_metrics=tmp_path / "bank.json",
        out_dir=out,
        sc_dir=sc,
        phonation_dir=phon,
        root=tmp_path,
        manifest=manifest,
        cards_dir=config.CARDS_DIR,
    )
    card = read_json(paths["card_json"])
    assert {s["system"]: s["invariance"]["verdict"] for s in card["s2s"]}["content_driven"] == C.CONTENT_DRIVEN
    assert card["checks"]["manipulation_check"]["verdict"] == "failed"
    assert card["provenance"]["seeds"] == {"base.seed": 5}
    assert card["provenance"]["model_revisions"]["mixed"]["revision"] == "reference-1"
    assert paths["card_md"].read_text(encoding="utf-8").startswith("# Audit card")
    assert seen["card"]["title"] == build.section_texts()["card"]["title"] and seen["card"]["tables"]


def test_the_drift_verdict_says_what_its_fits_hold_over(card, tmp_path):
    # the fixture's RQ1 table predates the voice intercept: its fits hold over passages only
    assert card["s2s"][0]["drift"]["generalises_over"] in (None, "passages (random); these voices")
    mixed = pd.read_csv(tmp_path / "analysis" / "rq1_mixed_models.csv")
    write_table(
        tmp_path / "analysis" / "rq1_mixed_models.csv",
        mixed.assign(random_effects="passage + voice", voices_per_gender=3),
    )
    again = C.audit_card(tmp_path / "analysis", None, GATE, CHECK, PROV)
    drifting = next(s for s in again["s2s"] if s["system"] == "drifting")
    assert drifting["drift"]["generalises_over"] == "passages and 3 voices per gender (random)"
    assert "passages and 3 voices per gender (random)" in set(C.card_tables(again)["card_s2s"]["RQ1 generalises over"])


def test_the_card_row_states_the_content_shift_of_the_voice_boundary():
    from tests.support.continuum_design import CONTINUUM, continuum_answers
    from voicebias.analysis.psychometric import psychometric_table
    from voicebias.report.card import continuum_shift

    parts = [
        continuum_answers(1, shift=-2.5, passages=20).assign(system="mixed", task="describe"),
        continuum_answers(2, slope=0.0, shift=0.0, passages=20).assign(system="content_driven", task="describe"),
    ]
    table = psychometric_table(pd.concat(parts, ignore_index=True), CONTINUUM)
    mixed = continuum_shift(table, "mixed", "describe")
    row = table[(table["system"] == "mixed") & (table["lang"] == "ALL") & (table["quantity"] == "shift")].iloc[0]
    assert mixed["shift_st"] == pytest.approx(row["estimate"]) and mixed["ci_low"] == pytest.approx(row["ci_low"])
    assert mixed["ci_high"] < 0
    assert mixed["sentence"] == (
        f"content shifts the boundary by {row['estimate']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}] st"
    )
    flat = continuum_shift(table, "content_driven", "describe")
    assert flat["sentence"].startswith("does not follow the voice (slope ") and flat["ci_low"] is None
    assert continuum_shift(table, "mixed", "summarize") is None and continuum_shift(None, "mixed", "describe") is None


def test_the_card_states_what_each_systems_calls_used_and_cost(tmp_path):
    """The usage stage's per-system totals reach the card: calls, audio minutes, tokens with their
    split, the cost at the card's price table, and the calls it could not price."""
    import json

    from voicebias.cost import usage_table, usage_totals, validate_pricing
    from voicebias.pipeline.usage import TOTAL_KEYS

    pricing = validate_pricing(
        {
            "currency": "USD",
            "per_million_tokens": {"input_text": 2.5, "input_audio": 40.0, "output_text": 10.0, "output_audio": 80.0},
            "source": "https://example.org/prices",
            "date": "2026-12-05",
        },
        "test",
    )
    split = {
        "prompt_tokens": 310,
        "completion_tokens": 70,
        "prompt_tokens_details": {"audio_tokens": 300, "text_tokens": 10},
        "completion_tokens_details": {"audio_tokens": 60, "text_tokens": 10},
    }
    totals_only = {"prompt_tokens": 310, "completion_tokens": 70}
    responses = pd.DataFrame(
        {
            "system": "api",
            "task": "describe",
            "stimulus_id": ["a", "b", "c"],
            "cache_key": ["k1", "k2", "k3"],
            "status": "ok",
            "attempts": 1,
            "output_duration_s": 30.0,
            "provenance": [json.dumps({"usage": u}) for u in (split, split, totals_only)],
        }
    )
    api = usage_table(responses, {"a": 60.0, "b": 60.0, "c": 60.0}, pricing, "s2s")
    local = usage_table(responses.assign(system="local", provenance="{}"), {"a": 60.0}, None, "s2s")
    usage = pd.DataFrame(
        [
            {"system": "api", "part": "ALL", "task": "ALL", **usage_totals(api, pricing)},
            {"system": "local", "part": "ALL", "task": "ALL", **usage_totals(local, None)},
        ],
        columns=[*TOTAL_KEYS, *usage_totals(api, pricing)],
    )
    card = C.audit_card(make_analysis(tmp_path / "analysis"), None, GATE, CHECK, PROV, usage=usage)
    entry = {u["system"]: u for u in card["usage"]}
    assert entry["api"]["calls"] == 3 and entry["api"]["priced_calls"] == 2
    assert entry["api"]["cost"] == pytest.approx(2 * (10 * 2.5 + 300 * 40 + 10 * 10 + 60 * 80) / 1e6)
    json.dumps(card)  # JSON-able: no numpy scalars
    rows = C.card_tables(card)["card_usage"].set_index("system")
    assert rows.loc["api", "audio in (min)"] == "3.00" and rows.loc["api", "audio out (min)"] == "1.50"
    assert rows.loc["api", "tokens in (text / audio)"] == "930 (20 / 600)"
    cost = 2 * (10 * 2.5 + 300 * 40 + 10 * 10 + 60 * 80) / 1e6
    assert rows.loc["api", "cost"] == f"{cost:.4f} USD (prices of 2026-12-05; 1 call(s) unpriced (no token split))"
    assert rows.loc["local", "tokens in (text / audio)"] == "–"
    assert rows.loc["local", "cost"] == "– (no price table in the system card)"
    assert "What the calls used and cost" in C.render_card_md(card)


def test_the_card_says_which_probed_systems_are_not_deterministic_and_what_that_needs(tmp_path):
    same = {"items": 8, "failed": 0, "text_agree": 8, "audio_agree": 8, "agree": 8, "agreement": 1.0}
    varies = {"items": 8, "failed": 1, "text_agree": 7, "audio_agree": 2, "agree": 2, "agreement": 2 / 7}
    determinism = {"steady": {"describe": same, "summarize": same}, "sampler": {"describe": varies}}
    card = C.audit_card(make_analysis(tmp_path / "analysis"), None, GATE, CHECK, PROV, determinism=determinism)
    by = {d["system"]: d for d in card["determinism"]}
    assert by["steady"]["verdict"] == "deterministic" and not by["steady"]["needs_samples"]
    assert by["sampler"]["verdict"] == "not deterministic" and by["sampler"]["needs_samples"]
    assert "need more than 1 answer per item" in by["sampler"]["note"]
    rows = C.card_tables(card)["card_determinism"].set_index("system")
    assert rows.loc["sampler", "agreement per task (same text and audio / answered probes)"] == (
        "describe 2/7 (1 probe(s) failed)"
    )
    assert rows.loc["steady", "agreement per task (same text and audio / answered probes)"] == (
        "describe 8/8; summarize 8/8"
    )
    # with repeats already drawn, the card does not ask for them
    card = C.audit_card(
        make_analysis(tmp_path / "a2"), None, GATE, CHECK, PROV, determinism=determinism, samples_per_item=3
    )
    assert not {d["system"]: d for d in card["determinism"]}["sampler"]["needs_samples"]
    assert "Does the same request give the same answer?" in C.render_card_md(card)


def test_refusals_and_non_compliance_per_task_with_wilson_intervals(tmp_path):
    """Per system x task, pooled over languages: the share of failed calls (refusals among them) and
    of describe answers naming no gender, with Wilson intervals from voicebias.analysis.intervals."""
    from voicebias.analysis.intervals import wilson

    analysis = make_analysis(tmp_path / "analysis")
    comp = pd.DataFrame(
        [
            {
                "system": "api",
                "lang": "en",
                "task": "describe",
                "n": 60,
                "failed": 3,
                "excluded": 1,
                "non_compliant": 8,
            },
            {
                "system": "api",
                "lang": "es",
                "task": "describe",
                "n": 60,
                "failed": 1,
                "excluded": 0,
                "non_compliant": 4,
            },
            {
                "system": "api",
                "lang": "en",
                "task": "readback",
                "n": 60,
                "failed": 0,
                "excluded": 0,
                "non_compliant": 0,
            },
        ]
    )
    comp.to_csv(analysis / "compliance.csv", index=False)
    card = C.audit_card(analysis, None, GATE, CHECK, PROV)
    by = {(c["system"], c["task"]): c for c in card["compliance"]}
    d = by[("api", "describe")]
    assert (d["calls"], d["failed"], d["answered"], d["non_compliant"]) == (120, 4, 115, 12)
    assert d["failed_rate"] == pytest.approx(4 / 120) and d["failed_ci"] == pytest.approx(list(wilson(4, 120)))
    assert d["non_compliant_rate"] == pytest.approx(12 / 115)
    assert d["non_compliant_ci"] == pytest.approx(list(wilson(12, 115)))
    assert by[("api", "readback")]["non_compliant"] is None  # non-compliance is scored on describe only
    rows = C.card_tables(card)["card_compliance"].set_index(["system", "task"])
    assert rows.loc[("api", "readback"), "non-compliant [95% CI]"] == "–"
    assert rows.loc[("api", "describe"), "failed or refused [95% CI]"].startswith("4 (0.033 [")
