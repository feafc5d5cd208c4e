"""score_outputs against hand computations: delta = output - input, its sign and its units.

Outputs are synthetic vowels at known F0 (source-filter, tests/fakes/stimuli.py), so the
measured output F0 is known in advance; the inputs' measures are set by hand.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.fakes.stimuli import MALE_VOWEL_FORMANTS, synthetic_vowel
from voicebias import config
from voicebias.audio import write_audio
from voicebias.instruments.composite import composite_measures, femininity_composite, reference_stats
from voicebias.instruments.units import hz_to_semitones
from voicebias.params import load_params
from voicebias.scoring.acoustic import score_outputs

SR = 16000


@pytest.fixture(scope="module")
def params() -> dict:
    return load_params(config.ROOT / "profiles" / "embedded.yaml")


def scored(params: dict, tmp_path, out_f0: dict[str, float | None], in_f0: dict[str, float]) -> pd.DataFrame:
    """score_outputs on one system's readback responses: out_f0[stimulus] is the output vowel's
    F0 in Hz (None: the call failed, no audio); in_f0[stimulus] the input's F0 in Hz."""
    names = composite_measures(params["acoustics"]["classifier"], params["acoustics"]["formant_term"])
    rows, inputs = [], []
    for i, (sid, f0) in enumerate(out_f0.items()):
        voice = "male" if i % 2 == 0 else "female"
        base = {
            "system": "s",
            "task": "readback",
            "stimulus_id": sid,
            "passage_id": sid[:-2],
            "lang": "en",
            "target_lang": "en",
            "pole": "neutral",
            "voice_gender": voice,
            "transcript": "A short answer.",
        }
        if f0 is None:
            rows.append({**base, "status": "failed", "output_audio": "", "output_sha256": ""})
        else:
            rel = f"out/{sid}.wav"
            (tmp_path / "out").mkdir(exist_ok=True)
            write_audio(tmp_path / rel, synthetic_vowel(f0, MALE_VOWEL_FORMANTS["a"], seconds=1.0, sr=SR), SR)
            rows.append({**base, "status": "ok", "output_audio": rel, "output_sha256": f"sha-{sid}-{f0}"})
        inputs.append(
            {
                "stimulus_id": sid,
                "lang": "en",
                "status": "ok",
                "f0_median_st": float(hz_to_semitones(in_f0[sid])),
                "vtl_index": 0.01 * i,
                "margin_acoustic_norms": 0.5 * i - 1.0,
                "duration_s": 1.0,
                "voiced_fraction": 0.9,
            }
        )
    inputs = pd.DataFrame(inputs)
    assert set(names) <= set(inputs.columns)
    reference = reference_stats(inputs, names)
    inputs["composite"] = femininity_composite(inputs, reference, names)
    return score_outputs(
        pd.DataFrame(rows), inputs, reference, params, {"output_voice_gender": None}, tmp_path, tmp_path / "cache"
    ).set_index("stimulus_id")


def test_delta_is_output_minus_input_in_semitones(params, tmp_path):
    out_f0 = {"p1-m": 220.0, "p1-f": 110.0, "p2-m": 150.0, "p2-f": None}
    in_f0 = {"p1-m": 110.0, "p1-f": 220.0, "p2-m": 150.0, "p2-f": 200.0}
    t = scored(params, tmp_path, out_f0, in_f0)
    # an octave up is +12 st, an octave down -12 st, the same pitch 0 (measurement within 0.2 st)
    assert t.loc["p1-m", "delta_f0_median_st"] == pytest.approx(12.0, abs=0.2)
    assert t.loc["p1-f", "delta_f0_median_st"] == pytest.approx(-12.0, abs=0.2)
    assert t.loc["p2-m", "delta_f0_median_st"] == pytest.approx(0.0, abs=0.2)
    assert t.loc["p1-m", "out_f0_median_st"] == pytest.approx(12 * np.log2(2.2), abs=0.2)  # re 100 Hz
    assert t.loc["p1-m", "in_f0_median_st"] == pytest.approx(12 * np.log2(1.1), abs=1e-12)
    ok = t[t["status"] == "ok"]
    assert len(ok) == 3
    for m in ("f0_median_st", "vtl_index", "margin_acoustic_norms", "composite"):
        assert np.allclose(ok[f"delta_{m}"], ok[f"out_{m}"] - ok[f"in_{m}"], rtol=0, atol=1e-12), m
        assert ok[f"delta_{m}"].notna().all()
    # the composite is the mean of the z-scored measures (input reference): its delta is the
    # mean of the measures' deltas over their reference SDs
    names = ["f0_median_st", "vtl_index", "margin_acoustic_norms"]
    ins = pd.DataFrame(
        {
            "f0_median_st": hz_to_semitones(np.array(list(in_f0.values()))),
            "vtl_index": 0.01 * np.arange(4),
            "margin_acoustic_norms": 0.5 * np.arange(4) - 1.0,
        }
    )
    sd = ins.std(ddof=1)
    expected = sum(ok[f"delta_{m}"] / sd[m] for m in names) / 3
    assert np.allclose(ok["delta_composite"], expected, atol=1e-9)
    # the failed call is a counted row with no measures, not dropped
    f = t.loc["p2-f"]
    assert f["status"] == "failed" and f["exclusion"] == "call failed" and pd.isna(f.get("delta_f0_median_st"))


def test_unmeasurable_output_is_excluded_with_its_reason(params, tmp_path):
    out_f0 = {"p1-m": 220.0, "p1-f": 180.0}
    t = scored(params, tmp_path, out_f0, {"p1-m": 110.0, "p1-f": 200.0})
    assert (t["status"] == "ok").all()
    write_audio(tmp_path / "out" / "p1-f.wav", np.zeros(SR, dtype=np.float32), SR)  # silence in place of speech
    rows = pd.DataFrame(
        [
            {
                "system": "s",
                "task": "readback",
                "stimulus_id": "p1-f",
                "passage_id": "p1",
                "lang": "en",
                "target_lang": "en",
                "pole": "neutral",
                "voice_gender": "female",
                "status": "ok",
                "transcript": "A short answer.",
                "output_audio": "out/p1-f.wav",
                "output_sha256": "sha-silent",
            }
        ]
    )
    inputs = pd.DataFrame(
        [
            {
                "stimulus_id": "p1-f",
                "lang": "en",
                "status": "ok",
                "f0_median_st": 12.0,
                "vtl_index": 0.0,
                "margin_acoustic_norms": 0.0,
                "duration_s": 1.0,
                "voiced_fraction": 0.9,
                "composite": 0.0,
            }
        ]
    )
    ref = pd.DataFrame(
        [
            {"lang": "en", "measure": m, "mean": 0.0, "sd": 1.0, "n": 2}
            for m in ("f0_median_st", "vtl_index", "margin_acoustic_norms")
        ]
    )
    s = score_outputs(rows, inputs, ref, params, {"output_voice_gender": None}, tmp_path, tmp_path / "cache2").iloc[0]
    assert s["status"] == "excluded" and s["exclusion"] != "" and pd.isna(s["delta_f0_median_st"])


CONTROL_VOICES = {"en": "en-us+f2"}


def fixed_voice_outputs(tmp_path, texts: dict[str, str], shift_st: dict[str, float]):
    """Responses of a system with one fixed eSpeak NG voice (en-us+f2), each output
    optionally moved by shift_st[stimulus] semitones (PSOLA), and their inputs."""
    from voicebias.systems.reference import shift_pitch
    from voicebias.tts import get_backend

    tts = get_backend("espeak", rate_wpm=160)
    rows, inputs = [], []
    for i, (sid, text) in enumerate(texts.items()):
        audio, sr = tts.synthesize(text, CONTROL_VOICES["en"])
        if shift_st.get(sid):
            audio = shift_pitch(audio, sr, shift_st[sid])
        rel = f"out/{sid}.flac"
        write_audio(tmp_path / rel, audio, sr)
        from voicebias.audio import sha256_file

        rows.append(
            {
                "system": "s",
                "task": "readback",
                "stimulus_id": sid,
                "passage_id": sid[:-2],
                "lang": "en",
                "target_lang": "en",
                "pole": "neutral",
                "voice_gender": "male" if i % 2 == 0 else "female",
                "transcript": text,
                "status": "ok",
                "output_audio": rel,
                "output_sha256": sha256_file(tmp_path / rel),
            }
        )
        inputs.append(
            {
                "stimulus_id": sid,
                "lang": "en",
                "status": "ok",
                "f0_median_st": 10.0 + i,
                "vtl_index": 0.01 * i,
                "margin_acoustic_norms": 0.5 * i - 1.0,
                "duration_s": 1.0,
                "voiced_fraction": 0.9,
            }
        )
    inputs = pd.DataFrame(inputs)
    names = composite_measures("acoustic_norms", "vtl_index")
    reference = reference_stats(inputs, names)
    inputs["composite"] = femininity_composite(inputs, reference, names)
    return pd.DataFrame(rows), inputs, reference


TEXTS = {
    "p1-m": "I fixed the engine and welded the frame before noon.",
    "p1-f": "She braided her daughter's hair and baked a cake.",
    "p2-m": "The meeting starts at nine in the second room.",
    "p2-f": "Please bring the report and two pens.",
}


def test_text_control_in_the_output_voice_gives_net_zero(params, tmp_path):
    """A fixed-voice output read in its own voice is its own text control: net_ is exactly 0
    while delta_ (output - input) is not."""
    rows, inputs, ref = fixed_voice_outputs(tmp_path, TEXTS, {})
    card = {"output_voice_gender": "female", "text_control": {"backend": "espeak", "voices": CONTROL_VOICES}}
    t = score_outputs(rows, inputs, ref, params, card, tmp_path, tmp_path / "cache").set_index("stimulus_id")
    assert (t["control_status"] == "ok").all() and (t["control_exclusion"] == "").all()
    for m in ("f0_median_st", "vtl_index", "margin_acoustic_norms", "composite"):
        assert (t[f"net_{m}"] == 0.0).all(), m
        assert np.allclose(t[f"ctrl_{m}"], t[f"out_{m}"], rtol=0, atol=0), m
    assert (t["delta_f0_median_st"].abs() > 0.1).all()


def test_text_control_keeps_a_planted_pitch_shift_and_removes_the_words(params, tmp_path):
    """Outputs moved by +2 / -2 st: net F0 is the planted shift within the instrument's F0
    accuracy (1 %, 0.17 st), whatever each text does to F0."""
    shift = {"p1-m": 2.0, "p1-f": -2.0, "p2-m": 2.0, "p2-f": 0.0}
    rows, inputs, ref = fixed_voice_outputs(tmp_path, TEXTS, shift)
    card = {"output_voice_gender": "female", "text_control": {"backend": "espeak", "voices": CONTROL_VOICES}}
    t = score_outputs(rows, inputs, ref, params, card, tmp_path, tmp_path / "cache").set_index("stimulus_id")
    for sid, st in shift.items():
        assert t.loc[sid, "net_f0_median_st"] == pytest.approx(st, abs=0.17), sid


def test_profile_control_voice_is_used_without_a_card_voice_and_bad_rows_are_counted(params, tmp_path):
    """Without a card text_control the profile's voice (en-us+m1) reads the transcript; an
    empty transcript or a language with no control voice excludes the control of that row
    only, with its reason, and leaves the output's own measures in place."""
    rows, inputs, ref = fixed_voice_outputs(tmp_path, TEXTS, {})
    rows.loc[rows["stimulus_id"] == "p1-f", "transcript"] = "  "
    rows.loc[rows["stimulus_id"] == "p2-f", "target_lang"] = "fr"
    t = score_outputs(
        rows, inputs, ref, params, {"output_voice_gender": "female"}, tmp_path, tmp_path / "cache"
    ).set_index("stimulus_id")
    assert params["acoustic_scoring"]["text_control"]["voices"]["en"] == "en-us+m1"
    assert t.loc["p1-f", "control_status"] == "excluded" and t.loc["p1-f", "control_exclusion"] == "empty transcript"
    assert "no text-control voice for language 'fr'" in t.loc["p2-f", "control_exclusion"]
    assert t.loc[["p1-f", "p2-f"], "net_f0_median_st"].isna().all()
    assert (t["status"] == "ok").all() and t["delta_f0_median_st"].notna().all()
    good = t.loc[["p1-m", "p2-m"]]
    assert (good["control_status"] == "ok").all()
    # a male variant reads lower than the female output voice: the net F0 is positive
    assert (good["net_f0_median_st"] > 3).all()
    assert np.allclose(good["net_f0_median_st"], good["out_f0_median_st"] - good["ctrl_f0_median_st"], atol=1e-12)


def test_text_control_can_be_switched_off(params, tmp_path):
    rows, inputs, ref = fixed_voice_outputs(tmp_path, dict(list(TEXTS.items())[:2]), {})
    off = {
        **params,
        "acoustic_scoring": {"text_control": {**params["acoustic_scoring"]["text_control"], "enabled": False}},
    }
    t = score_outputs(rows, inputs, ref, off, {"output_voice_gender": "female"}, tmp_path, tmp_path / "cache")
    assert not any(c.startswith(("net_", "ctrl_", "control_")) for c in t.columns)


def test_a_very_short_or_unreadable_output_is_an_excluded_row_and_the_others_are_scored(params, tmp_path):
    """A reply of 10 ms (too short for the pitch analysis) and a reply path that is a folder are
    excluded rows with their reasons; the other output is scored as it is alone."""
    (tmp_path / "alone").mkdir()
    alone = scored(params, tmp_path / "alone", {"p1-m": 220.0, "p1-f": 180.0}, {"p1-m": 110.0, "p1-f": 200.0})
    (tmp_path / "out").mkdir()
    write_audio(tmp_path / "out" / "p1-m.wav", synthetic_vowel(220.0, MALE_VOWEL_FORMANTS["a"], seconds=1.0, sr=SR), SR)
    t = np.arange(SR // 100) / SR
    write_audio(tmp_path / "out" / "p2-m.wav", (0.3 * np.cos(2 * np.pi * 150 * t)).astype(np.float32), SR)
    (tmp_path / "out" / "p3-m.wav").mkdir()
    base = {
        "system": "s",
        "task": "readback",
        "lang": "en",
        "target_lang": "en",
        "pole": "neutral",
        "voice_gender": "male",
        "status": "ok",
        "transcript": "A short answer.",
    }
    rows = pd.DataFrame(
        [
            {
                **base,
                "stimulus_id": sid,
                "passage_id": sid[:2],
                "output_audio": f"out/{sid}.wav",
                "output_sha256": f"sha-{sid}",
            }
            for sid in ("p1-m", "p2-m", "p3-m")
        ]
    )
    inputs = pd.DataFrame(
        [
            {
                "stimulus_id": sid,
                "lang": "en",
                "status": "ok",
                "f0_median_st": 12.0 * np.log2(1.1),
                "vtl_index": 0.0,
                "margin_acoustic_norms": -1.0,
                "duration_s": 1.0,
                "voiced_fraction": 0.9,
                "composite": 0.0,
            }
            for sid in ("p1-m", "p2-m", "p3-m")
        ]
    )
    ref = pd.DataFrame(
        [
            {"lang": "en", "measure": m, "mean": 0.0, "sd": 1.0, "n": 2}
            for m in ("f0_median_st", "vtl_index", "margin_acoustic_norms")
        ]
    )
    s = score_outputs(rows, inputs, ref, params, {"output_voice_gender": None}, tmp_path, tmp_path / "cache").set_index(
        "stimulus_id"
    )
    assert list(s["status"]) == ["ok", "excluded", "excluded"]
    assert s.loc["p2-m", "exclusion"].startswith("too short to measure: 10.0 ms")
    assert s.loc["p3-m", "exclusion"].endswith("a folder, not an audio file")
    assert s.loc[["p2-m", "p3-m"], ["out_f0_median_st", "delta_f0_median_st", "out_composite"]].isna().all().all()
    assert s.loc["p1-m", "out_f0_median_st"] == alone.loc["p1-m", "out_f0_median_st"]


def test_a_translation_is_scored_against_its_input_and_controlled_in_the_target_language(params, tmp_path):
    """Spanish inputs translated to English: delta_ is the English output's measure minus the
    Spanish input's, and the text control reads the English transcript in the English control
    voice (the card has no Spanish one), so a fixed-voice output's net_ is exactly 0."""
    rows, inputs, _ = fixed_voice_outputs(tmp_path, TEXTS, {})
    rows = rows.assign(lang="es", task="translate", target_lang="en")
    # the composite standardises within the input language, output and input alike
    inputs = inputs.assign(lang="es")
    names = composite_measures("acoustic_norms", "vtl_index")
    ref = reference_stats(inputs, names)
    inputs["composite"] = femininity_composite(inputs, ref, names)
    card = {"output_voice_gender": "female", "text_control": {"backend": "espeak", "voices": CONTROL_VOICES}}
    t = score_outputs(rows, inputs, ref, params, card, tmp_path, tmp_path / "cache").set_index("stimulus_id")
    assert (t["task"] == "translate").all() and (t["status"] == "ok").all()
    assert (t["control_status"] == "ok").all() and (t["control_exclusion"] == "").all()
    src = inputs.set_index("stimulus_id")
    for m in ("f0_median_st", "vtl_index", "margin_acoustic_norms", "composite"):
        assert np.array_equal(t[f"in_{m}"], src.loc[t.index, m]), m
        assert np.array_equal(t[f"delta_{m}"], t[f"out_{m}"] - t[f"in_{m}"]), m
        assert (t[f"net_{m}"] == 0.0).all(), m
