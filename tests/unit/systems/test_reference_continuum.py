"""The reference systems on the voice continuum: each answers by its planted psychometric function
(voicebias.systems.reference.planted_p_female_continuum), and the psychometric stage's pieces read
those answers and set planted against recovered (voicebias.pipeline.psychometric)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.support.continuum_design import CONTINUUM
from voicebias.analysis.psychometric import psychometric_table
from voicebias.params import validate_params
from voicebias.pipeline.psychometric import continuum_answers, planted_vs_recovered
from voicebias.systems.reference import planted_p_female_continuum, planted_psychometric


def _system(**kw):
    base = {"rule": "voice", "error_rate": 0.05, "noncompliance_rate": 0.0, "neutral_p_female": 0.5}
    return {**base, **kw}


def test_the_planted_function_is_the_stated_logistic_and_content_is_flat():
    voice = _system(psychometric={"slope_per_st": 2.0, "boundary_st": 4.0, "shift_st": -2.0})
    assert planted_p_female_continuum(voice, "masculine", 4.0) == pytest.approx(0.5)
    assert planted_p_female_continuum(voice, "feminine", 2.0) == pytest.approx(0.5)
    assert planted_p_female_continuum(voice, "neutral", 3.0) == pytest.approx(0.5)
    assert planted_p_female_continuum(voice, "masculine", 5.0) == pytest.approx(1 / (1 + np.exp(-2.0)))
    content = _system(rule="content")
    assert {planted_p_female_continuum(content, "feminine", x) for x in (0.0, 4.5, 9.1)} == {0.95}
    truth = planted_psychometric(voice, ["masculine", "feminine"])
    assert truth == {
        "follows_voice": True,
        "slope_per_st": 2.0,
        "pse_st": {"masculine": 4.0, "feminine": 2.0},
        "shift_st": -2.0,
    }
    assert planted_psychometric(content, ["masculine", "feminine"]) == {"follows_voice": False}


def test_unset_psychometric_params_take_the_schemas_defaults_and_typos_are_refused():
    assert planted_psychometric(_system(), ["masculine", "feminine"])["pse_st"] == {"masculine": 4.5, "feminine": 4.5}
    raw = {"systems": {"voice_faithful": {"rule": "voice", "psychometric": {"slope": 1.0}}}}
    with pytest.raises(Exception, match="psychometric.slope"):
        validate_params(raw, source="test")


def _answers(system: str, params: dict, passages: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(manifest, responses) of a reference system on a continuum, answered by its planted function."""
    rng = np.random.default_rng(seed)
    man, resp = [], []
    for pole in ("masculine", "feminine"):
        for i in range(passages):
            pid = f"en-{pole}-{i:02d}"
            for v in ("en-us+m3", "en-us+f3"):
                for step in range(CONTINUUM.steps):
                    sid = f"{pid}-{v}-s{step}"
                    man.append({"stimulus_id": sid, "step": step, "x_st": CONTINUUM.semitones(step), "voice_id": v})
                    p = planted_p_female_continuum(params, pole, CONTINUUM.semitones(step))
                    female = rng.random() < p
                    for task, text in (
                        ("describe", "female" if female else "male"),
                        ("summarize", "She spoke." if female else "He spoke."),
                    ):
                        resp.append(
                            {
                                "system": system,
                                "task": task,
                                "stimulus_id": sid,
                                "passage_id": pid,
                                "lang": "en",
                                "target_lang": "en",
                                "pole": pole,
                                "status": "ok",
                                "transcript": text,
                            }
                        )
    return pd.DataFrame(man), pd.DataFrame(resp)


def test_planted_slope_boundaries_and_shift_are_recovered_from_scored_answers():
    params = _system(
        rule="mixed", content_weight=0.5, psychometric={"slope_per_st": 1.2, "boundary_st": 4.5, "shift_st": -2.0}
    )
    flat = _system(rule="content")
    m1, r1 = _answers("mixed", params, 12, 1)
    m2, r2 = _answers("content_driven", flat, 12, 2)
    assert m1.equals(m2)  # one manifest: every system hears the same steps
    answers = continuum_answers(m1, pd.concat([r1, r2], ignore_index=True))
    assert answers["y"].notna().all() and set(answers["task"]) == {"describe", "summarize"}
    table = psychometric_table(answers, CONTINUUM)
    truth = {
        "mixed": planted_psychometric(params, ["masculine", "feminine"]),
        "content_driven": planted_psychometric(flat, ["masculine", "feminine"]),
    }
    out = planted_vs_recovered(table, truth)
    mixed = out[out["system"] == "mixed"]
    assert len(mixed) == 2 * 4  # slope, two PSEs and the shift, per task
    assert mixed["recovered"].all(), mixed
    flat_rows = out[out["system"] == "content_driven"]
    assert list(flat_rows["quantity"]) == ["slope", "slope"] and flat_rows["recovered"].all()
    assert out["recovered"].equals(out["planted_in_ci"].astype(bool))  # no refit: each value's own interval

    # with the refit every value also has its interval at the Bonferroni coverage over its system's values
    def refit(coverage):
        return psychometric_table(answers, CONTINUUM, confidence=coverage, pooled_only=True)

    both = planted_vs_recovered(table, truth, refit)
    k = both["system"].map({"mixed": 8, "content_driven": 2})
    assert both["simultaneous_confidence"].tolist() == pytest.approx((1 - 0.05 / k).tolist())
    bounded = both[both["simultaneous_ci_low"].notna()]
    assert len(bounded) >= 4  # the slopes at least
    assert (bounded["simultaneous_ci_low"] < bounded["ci_low"]).all()
    assert (bounded["simultaneous_ci_high"] > bounded["ci_high"]).all()
    assert both["recovered"].tolist() == both["planted_in_simultaneous_ci"].tolist()
    assert both["recovered"].all()
    # at the table's own coverage the refit rebuilds each value's own interval (Wald t, Fieller)
    same = planted_vs_recovered(table, truth, lambda c: refit(0.95))
    assert np.allclose(same["simultaneous_ci_low"], same["ci_low"], equal_nan=True)
    assert np.allclose(same["simultaneous_ci_high"], same["ci_high"], equal_nan=True)


def test_an_unscorable_answer_is_left_out_not_guessed():
    man = pd.DataFrame([{"stimulus_id": "a", "step": 0, "x_st": 0.0, "voice_id": "v"}])
    resp = pd.DataFrame(
        [
            {
                "system": "s",
                "task": t,
                "stimulus_id": "a",
                "passage_id": "p",
                "lang": "en",
                "target_lang": "en",
                "pole": "masculine",
                "status": "ok",
                "transcript": text,
            }
            for t, text in (("describe", "I cannot tell."), ("summarize", "He and she talked."))
        ]
    )
    assert continuum_answers(man, resp)["y"].isna().all()
