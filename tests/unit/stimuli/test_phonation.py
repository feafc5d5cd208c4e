"""Phonation conversion on synthetic voices with known properties, and the manipulation check."""

from __future__ import annotations

import numpy as np
import pandas as pd
import parselmouth
import pytest
from parselmouth.praat import call
from scipy import signal

from voicebias.gates.phonation_check import expected_signs, summarise, validate_check
from voicebias.instruments.acoustics import MeasureSettings, measure_signal
from voicebias.stimuli.phonation import ParametricSettings, convert_parametric, select_prompts
from voicebias.stimuli.phonation.presets import FEATURES, PAPER_PRESETS, conditioning, n_frames
from voicebias.validation import ValidationFailed

SR = 16000
F0 = 120.0
SETTINGS = MeasureSettings(pitch_floor=60, pitch_ceiling=300, max_formant=5000, cpps_time_step=0.005)


def vowel(f0: float = F0, seconds: float = 1.6, seed: int = 0) -> np.ndarray:
    """A sustained synthetic vowel: a pulse train with a -12 dB/octave source tilt
    (two one-pole low-passes) through resonators at 500, 1500 and 2500 Hz, with a
    slow 3 % vibrato so Praat tracks it like speech."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * SR)) / SR
    f = f0 * (1 + 0.03 * np.sin(2 * np.pi * 3 * t))
    phase = np.cumsum(f) / SR
    pulses = np.diff(np.floor(phase), prepend=0.0)
    x = signal.lfilter([1.0], [1.0, -0.97], pulses)
    x = signal.lfilter([1.0], [1.0, -0.97], x)
    for fc, bw in ((500, 80), (1500, 100), (2500, 140)):
        r = np.exp(-np.pi * bw / SR)
        x = signal.lfilter([1 - r], [1, -2 * r * np.cos(2 * np.pi * fc / SR), r * r], x)
    x += 1e-5 * rng.standard_normal(len(x))
    return (0.1 * x / np.sqrt(np.mean(x**2))).astype(np.float32)


def cond_of(frames: int, **targets: float) -> np.ndarray:
    return conditioning({"shape": "constant", "targets": targets}, frames)


def convert(x: np.ndarray, settings: ParametricSettings | None = None, seed: int = 1, **targets: float) -> np.ndarray:
    y, _ = convert_parametric(x, SR, cond_of(n_frames(len(x) / SR), **targets), 60, 300, settings, seed)
    return y


def jitter_local(x: np.ndarray) -> float:
    snd = parselmouth.Sound(x.astype(np.float64), sampling_frequency=SR)
    pp = call(snd, "To PointProcess (periodic, cc)", 60, 300)
    return call(pp, "Get jitter (local)", 0, 0, 0.0001, 0.02, 1.3)


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return vowel()


@pytest.fixture(scope="module")
def base(x) -> dict:
    return measure_signal(x, SR, SETTINGS)


def test_modal_conditioning_returns_the_signal_unchanged(x):
    y = convert(x)
    assert np.allclose(y, x, atol=1e-6)


def test_length_rms_and_determinism(x):
    a = convert(x, creak=2, cpps=-1, h1_h2=-2)
    b = convert(x, creak=2, cpps=-1, h1_h2=-2)
    c = convert(x, seed=2, creak=2, cpps=-1, h1_h2=-2)
    assert len(a) == len(x)
    assert np.sqrt(np.mean(a.astype(float) ** 2)) == pytest.approx(np.sqrt(np.mean(x.astype(float) ** 2)), rel=1e-3)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("sd", [1.0, 2.0, 3.0])
def test_tilt_raises_h1_h2_by_the_closed_form_amount(x, base, sd):
    """A gain of -a dB per octave between 50 and 600 Hz moves H1 (120 Hz) against
    H2 (240 Hz) by exactly a dB: a = tilt_db_per_octave_per_sd x SD."""
    s = ParametricSettings()
    m = measure_signal(convert(x, h1_h2=sd), SR, SETTINGS)
    assert m["h1_h2_db"] - base["h1_h2_db"] == pytest.approx(s.tilt_db_per_octave_per_sd * sd, abs=0.3)
    assert m["h1_a3_db"] > base["h1_a3_db"] + sd  # A3 lies above the tilt band: it drops by more


def test_negative_tilt_lowers_h1_h2_and_h1_a3(x, base):
    m = measure_signal(convert(x, h1_h2=-2, h1_a3=-2), SR, SETTINGS)
    assert m["h1_h2_db"] - base["h1_h2_db"] == pytest.approx(-2.0, abs=0.3)
    assert m["h1_a3_db"] < base["h1_a3_db"] - 2.0


def test_h1_a3_shelf_scales_with_the_parameter_and_leaves_h1_h2(x, base):
    d = [measure_signal(convert(x, h1_a3=sd), SR, SETTINGS) for sd in (1.0, 3.0)]
    assert [m["h1_h2_db"] - base["h1_h2_db"] for m in d] == pytest.approx([0, 0], abs=0.2)
    g1, g3 = (m["h1_a3_db"] - base["h1_a3_db"] for m in d)
    # full shelf from 2 kHz: A3 (2.5 kHz) attenuated by shelf_db_per_sd x SD
    assert g1 == pytest.approx(1.0, abs=0.5) and g3 == pytest.approx(3.0, abs=0.7)


def test_aspiration_noise_lowers_cpps_monotonically(x, base):
    cpps = [measure_signal(convert(x, cpps=-sd), SR, SETTINGS)["cpps_db"] for sd in (1.0, 2.0, 4.0)]
    assert base["cpps_db"] > cpps[0] > cpps[1] > cpps[2]
    assert base["cpps_db"] - cpps[2] > 3.0


def test_creak_lowers_f0_by_the_planted_semitones_and_adds_jitter(x, base):
    s = ParametricSettings()
    j0 = jitter_local(x)
    rows = []
    for sd in (1.0, 2.0, 4.0):
        y = convert(x, creak=sd)
        m = measure_signal(y, SR, SETTINGS)
        rows.append((m["f0_median_st"] - base["f0_median_st"], jitter_local(y), m["cpps_db"]))
    for (df0, _, _), sd in zip(rows, (1.0, 2.0, 4.0)):
        assert df0 == pytest.approx(-s.creak_semitones_per_sd * sd, abs=0.5)
    jit = [r[1] for r in rows]
    assert j0 < jit[0] < jit[1] < jit[2]
    assert rows[2][2] < base["cpps_db"] - 2.0


def test_paper_presets_move_the_measures_the_intended_way(x, base):
    frames = n_frames(len(x) / SR)
    m = {}
    for c in ("breathy", "creaky"):
        y, _ = convert_parametric(x, SR, conditioning(PAPER_PRESETS[c], frames), 60, 300, seed=3)
        m[c] = measure_signal(y, SR, SETTINGS)
    assert m["breathy"]["h1_h2_db"] > base["h1_h2_db"] > m["creaky"]["h1_h2_db"]
    assert m["breathy"]["cpps_db"] < base["cpps_db"] and m["creaky"]["cpps_db"] < base["cpps_db"]
    assert m["creaky"]["f0_median_st"] < base["f0_median_st"] - 1.0


def test_endcreak_leaves_the_first_half_and_creaks_the_second():
    x = vowel(seconds=3.0, seed=4)
    y, _ = convert_parametric(x, SR, conditioning(PAPER_PRESETS["endcreak"], n_frames(len(x) / SR)), 60, 300, seed=5)
    h = len(x) // 2
    first, second = measure_signal(y[:h], SR, SETTINGS), measure_signal(y[h:], SR, SETTINGS)
    modal_second = measure_signal(x[h:], SR, SETTINGS)
    # the first 45 % is (nearly) the original: the ramp starts at the midpoint
    k = int(0.45 * len(x))
    assert np.corrcoef(x[:k], y[:k])[0, 1] > 0.98
    assert second["cpps_db"] < first["cpps_db"] - 1.0 and second["cpps_db"] < modal_second["cpps_db"] - 1.0
    assert second["f0_median_st"] < first["f0_median_st"] - 1.0
    assert second["f0_median_st"] < modal_second["f0_median_st"] - 1.0


def test_unknown_parametric_setting_is_named():
    with pytest.raises(ValueError, match="tilt_db_per_octave"):
        ParametricSettings.from_params({"tilt_db_per_octave": 2})


def test_select_prompts_per_category_then_overall():
    man = pd.DataFrame(
        {
            "prompt_id": [f"nop-{i:03d}" for i in range(1, 7) for _ in range(2)],
            "category": [c for c in "aabbcc" for _ in range(2)],
            "stimulus_id": [f"nop-{i:03d}-{v}" for i in range(1, 7) for v in ("m", "f")],
        }
    )
    sel = select_prompts(man, 1, None)
    assert sorted(sel["prompt_id"].unique()) == ["nop-001", "nop-003", "nop-005"]
    assert len(sel) == 6
    assert sorted(select_prompts(man, 1, 2)["prompt_id"].unique()) == ["nop-001", "nop-003"]
    assert len(select_prompts(man, None, None)) == 12


# ------------------------------------------------------------------ manipulation check


def test_expected_signs_follow_the_presets():
    assert expected_signs(PAPER_PRESETS["breathy"]) == {"h1_h2_db": 1, "h1_a3_db": 1, "cpps_db": -1}
    assert expected_signs(PAPER_PRESETS["creaky"]) == {
        "h1_h2_db": -1,
        "h1_a3_db": -1,
        "cpps_db": -1,
        "f0_median_st": -1,
    }
    assert expected_signs(PAPER_PRESETS["modal"]) == {}


def _changes(sign_flip: float) -> pd.DataFrame:
    rows = []
    for i in range(4):
        for measure, sign in (("h1_h2_db", 1), ("cpps_db", -1)):
            rows.append(
                {
                    "stimulus_id": f"s{i}-breathy",
                    "lang": "en",
                    "voice_gender": "female",
                    "voice_id": "v1",
                    "phonation": "breathy",
                    "measure": measure,
                    "contrast": "converted_vs_modal",
                    "expected_sign": sign,
                    "change": sign * sign_flip * (1.0 + 0.1 * i),
                }
            )
    return pd.DataFrame(rows)


def _similarities(own_similarity: float) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(manifest, similarity to the modal original, between-voice similarity 0.7) of 4 breathy files."""
    man = pd.DataFrame(
        {
            "stimulus_id": [f"s{i}-breathy" for i in range(4)],
            "lang": "en",
            "voice_gender": "female",
            "voice_id": "v1",
            "phonation": "breathy",
            "prompt_id": [f"p{i}" for i in range(4)],
        }
    )
    own = pd.DataFrame({"stimulus_id": man["stimulus_id"], "speaker_similarity": own_similarity})
    between = pd.DataFrame(
        {
            "prompt_id": man["prompt_id"],
            "voice_gender": "female",
            "voice_id": "v1",
            "other_voice_id": "v2",
            "between_similarity": 0.7,
        }
    )
    return man, own, between


def test_check_passes_when_the_measures_move_the_intended_way():
    man, own, between = _similarities(0.9)
    summary = summarise(_changes(+1), own, between, man)
    row = summary[summary["measure"] == "h1_h2_db"].iloc[0]
    assert row["n"] == 4 and row["mean_change"] == pytest.approx(1.15)
    margin = summary[summary["contrast"] == "margin_over_other_voice_same_gender"].iloc[0]
    assert margin["mean_change"] == pytest.approx(0.2)
    validate_check(summary)


def test_check_fails_naming_the_cell_that_moved_the_wrong_way():
    man, own, between = _similarities(0.6)
    summary = summarise(_changes(-1), own, between, man)
    with pytest.raises(ValidationFailed) as err:
        validate_check(summary)
    msg = str(err.value)
    assert "en/v1/breathy/h1_h2_db/converted_vs_modal" in msg
    assert "en/v1/breathy/cpps_db/converted_vs_modal" in msg
    assert "speaker_similarity/margin_over_other_voice_same_gender" in msg


def test_conditioning_columns_are_in_vqvc_feature_order():
    c = conditioning(PAPER_PRESETS["creaky"], 3)
    assert list(c[0]) == [2.0, -1.5, -2.0, 0.0, -2.0, 0.0]
    assert FEATURES == ("creak", "cpps", "h1_h2", "pitch", "h1_a3", "pitch_var")


def test_classifier_flips_per_condition_are_counted_and_stop_the_check(tmp_path, x):
    """A 120 Hz voice with male formants labelled female is a flip; labelled male it is not."""
    from voicebias.audio import write_audio
    from voicebias.gates.phonation_check import classifier_flips, measure_stimuli, validate_flips

    write_audio(tmp_path / "a.flac", x, SR)
    man = pd.DataFrame(
        {
            "stimulus_id": ["m-modal", "f-breathy"],
            "source_stimulus_id": ["m", "f"],
            "voice_gender": ["male", "female"],
            "voice_id": ["v1", "v2"],
            "phonation": ["modal", "breathy"],
            "path": ["a.flac", "a.flac"],
        }
    )
    acoustics = {
        "pitch_range": {"male": [60, 300], "female": [60, 500]},
        "max_formant": {"male": 5000, "female": 5000},
        "time_step": 0.01,
        "classifier": "acoustic_norms",
        "cpps_time_step": 0.005,
    }
    measured = measure_stimuli(man, acoustics, tmp_path, workers=1)
    margins, table = classifier_flips(measured, acoustics, tmp_path)
    t = table.set_index(["voice_gender", "phonation"])
    assert t.loc[("male", "modal"), "flips"] == 0 and t.loc[("female", "breathy"), "flips"] == 1
    with pytest.raises(ValidationFailed, match="f-breathy/acoustic_norms"):
        validate_flips(margins)
    validate_flips(margins[margins["voice_gender"] == "male"])


def test_a_stimulus_whose_halves_are_too_short_is_excluded_with_the_reason(tmp_path, x):
    """100 ms of voice is long enough to measure whole (70 ms at a 60 Hz floor) but its 50 ms
    halves are not: the stimulus is excluded as too_short, the other one measured."""
    from voicebias.audio import write_audio
    from voicebias.gates.phonation_check import measure_stimuli

    write_audio(tmp_path / "a.flac", x, SR)
    write_audio(tmp_path / "short.flac", x[: SR // 10], SR)
    man = pd.DataFrame(
        {"stimulus_id": ["long", "short"], "voice_gender": ["male", "male"], "path": ["a.flac", "short.flac"]}
    )
    acoustics = {
        "pitch_range": {"male": [60, 300]},
        "max_formant": {"male": 5000},
        "time_step": 0.01,
        "cpps_time_step": 0.005,
    }
    m = measure_stimuli(man, acoustics, tmp_path, workers=1).set_index("stimulus_id")
    assert list(m["measure_status"]) == ["ok", "excluded"]
    assert m.loc["short", "measure_error"].startswith("too_short: too short to measure: 50.0 ms")
    assert np.isfinite(m.loc["long", "h1_h2_db_first_half"]) and pd.isna(m.loc["short", "h1_h2_db_first_half"])
    assert np.isfinite(m.loc["short", "h1_h2_db_whole"])  # the part before the exclusion keeps its values


# ------------------------------------------------------------------ the converter's Praat exchanges


def _manip(x: np.ndarray):
    return call(parselmouth.Sound(x.astype(np.float64), sampling_frequency=SR), "To Manipulation", 0.01, 60, 300)


def test_pitch_tier_read_from_text_gives_praats_points_and_values_at_any_time(x, tmp_path):
    from voicebias.stimuli.phonation import _pitch_tier_value, _read_pitch_tier

    tier = call(_manip(x), "Extract pitch tier")
    start, end, times, values = _read_pitch_tier(tier, tmp_path / "t.PitchTier")
    n = call(tier, "Get number of points")
    assert n > 100 and len(times) == len(values) == n
    assert (start, end) == (call(tier, "Get start time"), call(tier, "Get end time"))
    assert times == [call(tier, "Get time from index", i) for i in range(1, n + 1)]
    assert values == [call(tier, "Get value at index", i) for i in range(1, n + 1)]
    queries = (
        list(np.linspace(start - 0.05, end + 0.05, 2000)) + times + [0.5 * (a + b) for a, b in zip(times, times[1:])]
    )
    assert [_pitch_tier_value(times, values, float(t)) for t in queries] == [
        call(tier, "Get value at time", float(t)) for t in queries
    ]


def test_pitch_tier_written_as_text_holds_exactly_the_points_added_one_by_one(x, tmp_path):
    from voicebias.stimuli.phonation import _write_pitch_tier

    manip = _manip(x)
    rng = np.random.default_rng(3)
    times = list(np.cumsum(1 / rng.uniform(70, 140, 150)) + 0.02)
    values = list(rng.uniform(60, 300, 150) / 3.0)
    added = call(manip, "Extract pitch tier")
    call(added, "Remove points between", 0.0, len(x) / SR)
    for t, f in zip(times, values):
        call(added, "Add point", float(t), float(f))
    written = _write_pitch_tier(
        tmp_path / "n.PitchTier", call(added, "Get start time"), call(added, "Get end time"), times, values
    )
    for tier in (added, written):
        assert [call(tier, "Get time from index", i) for i in range(1, 151)] == [float(t) for t in times]
        assert [call(tier, "Get value at index", i) for i in range(1, 151)] == [float(v) for v in values]
    resynth = []
    for tier in (added, written):
        m = _manip(x)
        call([tier, m], "Replace pitch tier")
        resynth.append(call(m, "Get resynthesis (overlap-add)").values.tobytes())
    assert resynth[0] == resynth[1]


def test_a_shared_manipulation_copy_resynthesises_like_a_fresh_one(x):
    from voicebias.stimuli.phonation import _manipulation

    snd = parselmouth.Sound(x.astype(np.float64), sampling_frequency=SR)
    first, second = _manipulation(snd, 60, 300), _manipulation(snd, 60, 300)
    tier = call(first, "Extract pitch tier")
    call(tier, "Formula", "self * 0.8")
    call([tier, first], "Replace pitch tier")  # changing one copy leaves the next untouched
    third = _manipulation(snd, 60, 300)
    fresh = call(snd, "To Manipulation", 0.01, 60, 300)
    out = [call(m, "Get resynthesis (overlap-add)").values.tobytes() for m in (second, third, fresh)]
    assert out[0] == out[1] == out[2]
    assert call(first, "Get resynthesis (overlap-add)").values.tobytes() != out[2]


def test_conversions_on_every_core_equal_one_by_one(tmp_path):
    from voicebias.audio import write_audio
    from voicebias.stimuli.phonation import convert_all
    from voicebias.stimuli.phonation.presets import presets_from_params

    presets = presets_from_params(None)
    jobs = []
    for k, f0 in enumerate((110.0, 210.0)):
        src = tmp_path / f"src{k}.flac"
        write_audio(src, vowel(f0, 1.2, seed=k), SR)
        for c in ("breathy", "creaky", "endcreak"):
            jobs.append(
                {
                    "key": f"{k}-{c}",
                    "src": str(src),
                    "preset": presets[c],
                    "condition": c,
                    "floor": 60.0,
                    "ceiling": 400.0,
                    "settings": ParametricSettings(),
                    "seed": 7 + k,
                }
            )
    jobs.append({**jobs[0], "key": "missing", "src": str(tmp_path / "absent.flac")})
    outs = {}
    for workers in (2, 1):
        run = [{**j, "out": str(tmp_path / f"w{workers}" / f"{j['key']}.flac")} for j in jobs]
        outs[workers] = convert_all(run, workers=workers)
        outs[workers] = [
            (r, (tmp_path / f"w{workers}" / f"{r['key']}.flac").read_bytes() if r["status"] == "ok" else b"")
            for r in outs[workers]
        ]
    assert [r["key"] for r, _ in outs[2]] == [j["key"] for j in jobs]
    assert [r["status"] for r, _ in outs[2]] == ["ok"] * 6 + ["failed"]
    assert "file not found" in outs[2][-1][0]["error"]
    assert pd.DataFrame([r for r, _ in outs[2]]).equals(pd.DataFrame([r for r, _ in outs[1]]))
    assert [b for _, b in outs[2]] == [b for _, b in outs[1]]


def test_a_flip_or_an_unmeasurable_file_is_a_counted_exclusion_up_to_the_limit(tmp_path, x):
    """Per-stimulus policy: the male-sounding 'female' file is excluded as classifier_flip, the
    100 ms file as too_short (its halves cannot be measured), the good one kept; with 2 of 3
    excluded a limit of 0.7 lets the check go on, 0.5 stops it, naming both with their reasons."""
    from voicebias.audio import write_audio
    from voicebias.gates.phonation_check import (
        classifier_flips,
        measure_stimuli,
        stimulus_exclusions,
        validate_exclusions,
    )

    write_audio(tmp_path / "a.flac", x, SR)
    write_audio(tmp_path / "short.flac", x[: SR // 10], SR)
    man = pd.DataFrame(
        {
            "stimulus_id": ["m-modal", "f-breathy", "m-short"],
            "lang": ["en"] * 3,
            "voice_gender": ["male", "female", "male"],
            "voice_id": ["v1", "v2", "v1"],
            "phonation": ["modal", "breathy", "creaky"],
            "path": ["a.flac", "a.flac", "short.flac"],
        }
    )
    acoustics = {
        "pitch_range": {"male": [60, 300], "female": [60, 500]},
        "max_formant": {"male": 5000, "female": 5000},
        "time_step": 0.01,
        "classifier": "acoustic_norms",
        "cpps_time_step": 0.005,
    }
    measured = measure_stimuli(man, acoustics, tmp_path, workers=1)
    margins, _ = classifier_flips(measured, acoustics, tmp_path)
    ex = stimulus_exclusions(measured, margins)
    assert ex["stimulus_id"].tolist() == ["f-breathy", "m-short"]
    assert ex["reason"].tolist() == ["classifier_flip", "too_short"]
    assert ex.iloc[0]["detail"].startswith("acoustic_norms margin -")
    validate_exclusions(ex, 3, 0.7)
    with pytest.raises(ValidationFailed, match=r"2 of 3 stimuli excluded .*classifier_flip 1, too_short 1.*f-breathy"):
        validate_exclusions(ex, 3, 0.5)
