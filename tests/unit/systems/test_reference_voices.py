"""Planted between-voice variation in the reference systems (systems.<name>.voice_error_rates)."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from voicebias.errors import ConfigError
from voicebias.systems.reference import ReferenceSystem, planted_p_female, planted_truth

PARAMS = {
    "rule": "voice",
    "error_rate": 0.05,
    "noncompliance_rate": 0.0,
    "neutral_p_female": 0.5,
    "drift_st": 0.0,
    "voice_error_rates": {"f_b": 0.4},
}


def manifest(n_per_voice=200):
    """Two female and one male voice, each reading every pole equally often."""
    rows = []
    for voice, gender in (("f_a", "female"), ("f_b", "female"), ("m_a", "male")):
        for i in range(n_per_voice):
            pole = ("masculine", "neutral", "feminine")[i % 3]
            rows.append(
                {
                    "stimulus_id": f"{voice}-{i:03d}",
                    "passage_id": f"p{i:03d}",
                    "pole": pole,
                    "voice_gender": gender,
                    "voice_id": voice,
                }
            )
    return pd.DataFrame(rows)


def test_a_planted_voice_is_misjudged_at_its_own_rate_and_the_rest_at_the_error_rate():
    assert planted_p_female(PARAMS, "neutral", "female", "f_b") == pytest.approx(0.6)
    assert planted_p_female(PARAMS, "neutral", "female", "f_a") == pytest.approx(0.95)
    assert planted_p_female(PARAMS, "feminine", "female") == pytest.approx(0.95)  # no voice named
    mixed = {**PARAMS, "rule": "mixed", "content_weight": 0.5}
    # the content half is untouched: 0.5 (1 - 0.05) + 0.5 (1 - 0.4) for feminine content
    assert planted_p_female(mixed, "feminine", "female", "f_b") == pytest.approx(0.5 * 0.95 + 0.5 * 0.6)


def test_planted_truth_weights_the_planted_voice_by_its_share_of_the_design():
    stim = manifest()
    truth = planted_truth(PARAMS, stim)
    assert truth["voice_misgender_rate"] == {"f_b": pytest.approx(0.4)}
    # aligned cells: f_a and f_b read equally many feminine passages, m_a the masculine ones
    n_fa = n_fb = (stim[(stim.voice_id == "f_a")].pole == "feminine").sum()
    n_m = (stim[(stim.voice_id == "m_a")].pole == "masculine").sum()
    expected = (n_fa * 0.05 + n_fb * 0.4 + n_m * 0.05) / (n_fa + n_fb + n_m)
    assert truth["misgender_rate"]["aligned"] == pytest.approx(expected)
    # without the manifest the balanced-cell truth of the rule alone
    assert planted_truth(PARAMS)["misgender_rate"]["aligned"] == pytest.approx(0.05)
    # content plays no part in a voice effect: the odds ratio per content step is still 1
    assert truth["odds_ratio_per_step"] == pytest.approx(1.0)


def test_a_planted_voice_that_reads_nothing_is_refused():
    with pytest.raises(ConfigError, match="voice_error_rates names f_z, which read"):
        planted_truth({**PARAMS, "voice_error_rates": {"f_z": 0.3}}, manifest(3))


def test_the_system_answers_at_the_planted_rates():
    stim = manifest(600)
    passages = pd.DataFrame({"passage_id": stim["passage_id"].unique(), "text": "x", "gloss_en": "x"})
    ref = ReferenceSystem(
        "probe",
        {"adapter": "reference", "output_voice": {"en": "en-us"}},
        PARAMS,
        stimuli=stim,
        passages=passages,
    )
    judged = np.array(
        [ref._judge(s, SimpleNamespace(seed=7, stimulus_id=s.name, task="describe")) for _, s in ref.stimuli.iterrows()]
    )
    wrong = judged != ref.stimuli["voice_gender"].to_numpy()
    for voice, rate in (("f_a", 0.05), ("f_b", 0.4), ("m_a", 0.05)):
        k = int(wrong[ref.stimuli["voice_id"].to_numpy() == voice].sum())
        assert stats.binomtest(k, 600, rate).pvalue > 0.001, (voice, k)
