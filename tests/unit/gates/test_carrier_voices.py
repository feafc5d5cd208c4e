"""The carrier gate with several voices per gender: voices are blocks, and each is certified."""

import numpy as np
import pandas as pd

from voicebias.gates.carrier_gate import PASSING, carrier_gate, voice_certificates

#: three voices per gender, far apart in F0 (semitones re 100 Hz)
VOICES = {"male": {"m_a": 2.0, "m_b": 4.0, "m_c": 6.0}, "female": {"f_a": 11.0, "f_b": 13.0, "f_c": 15.0}}


def rotated_inputs(leak_voice=None, leak_st=0.0, flip=None, seed=5, noise_st=0.1):
    """30 passages of one language, each read once per gender, the voices in rotation over the
    passages in pole order (so poles hold the voices in 4/3/3 shares); no content effect, or a
    pitch leak for feminine content in one voice only."""
    rng = np.random.default_rng(seed)
    rows = []
    passages = [(pole, i) for pole in ("masculine", "neutral", "feminine") for i in range(10)]
    for k, (pole, i) in enumerate(passages):
        for gender, voices in VOICES.items():
            voice, f0 = list(voices.items())[k % 3]
            st = f0 + rng.normal(0, noise_st) + (leak_st if voice == leak_voice and pole == "feminine" else 0.0)
            sid = f"en-{pole}-{i:02d}-{gender}"
            margin = (st - 8.5) * 3 * (-1 if sid == flip else 1)
            rows.append(
                {
                    "stimulus_id": sid,
                    "lang": "en",
                    "pole": pole,
                    "voice_gender": gender,
                    "voice_id": voice,
                    "status": "ok",
                    "f0_median_st": st,
                    "margin_clf": margin,
                    "composite": (st - 8.5) / 4.5,
                }
            )
    return pd.DataFrame(rows)


def test_voices_that_read_unequal_shares_of_a_pole_are_not_a_content_effect():
    inputs = rotated_inputs()
    table, flips = carrier_gate(inputs, ["clf"], 0.05, "composite", ["f0_median_st"])
    assert table["verdict"].isin(PASSING).all() and flips.empty
    assert (table.loc[table["measure"] == "composite", "p_content"] > 0.05).all()
    f0 = table[table["measure"] == "f0_median_st"].iloc[0]
    assert abs(f0["fem_minus_masc"]) < 0.05
    # blocking on gender alone mistakes the voices' 4/3/3 shares per pole for content: the feminine
    # passages hold one more of the highest voice and one fewer of the lowest, 0.4 st apart on average
    by_gender, _ = carrier_gate(inputs.drop(columns="voice_id"), ["clf"], 0.05, "composite", ["f0_median_st"])
    f0 = by_gender[by_gender["measure"] == "f0_median_st"].iloc[0]
    assert abs(f0["fem_minus_masc"] - 0.4) < 0.05


def test_every_voice_is_certified_when_nothing_leaks():
    voices = voice_certificates(rotated_inputs(), ["clf"], 0.05)
    assert sorted(voices["voice_id"]) == sorted(v for g in VOICES.values() for v in g)
    assert (voices["verdict"] == "pass").all() and (voices["n"] == 10).all() and (voices["flips"] == 0).all()
    assert voices["p_directional_holm"].between(0, 1).all()


def test_a_leak_in_one_voice_fails_that_voice_and_names_it():
    voices = voice_certificates(rotated_inputs(leak_voice="f_b", leak_st=1.0), ["clf"], 0.05).set_index("voice_id")
    assert voices.loc["f_b", "verdict"] == "fail"
    assert voices.loc["f_b", "fem_minus_masc"] > 0.2 and voices.loc["f_b", "p_directional_holm"] < 0.05
    assert (voices.drop(index="f_b")["verdict"] == "pass").all()


def test_a_flip_fails_its_voice_only():
    sid = "en-neutral-04-female"  # passage k = 14: the female voice 14 mod 3 = 2, f_c
    voices = voice_certificates(rotated_inputs(flip=sid), ["clf"], 0.05).set_index("voice_id")
    assert voices.loc["f_c", "verdict"] == "fail" and voices.loc["f_c", "flips"] == 1
    assert voices.loc["f_c", "at_fault"] == sid
    assert (voices.drop(index="f_c")["verdict"] == "pass").all()


def test_one_voice_per_gender_tables_without_voice_id_still_work():
    one = rotated_inputs().drop(columns="voice_id")
    voices = voice_certificates(one, ["clf"], 0.05)
    assert sorted(voices["voice_id"]) == ["female", "male"] and (voices["n"] == 30).all()
