"""Voice continua (voicebias.stimuli.continuum): the documented endpoints are Hillenbrand et al.'s
(1995) table, steps made with Praat's "Change gender" land on their F0 and formant targets in real
read speech, and the manipulation check counts the steps that do not, with a reason."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import soundfile as sf

from tests.support.real import HILLENBRAND, LIBRISPEECH
from voicebias.instruments.acoustics import MeasureSettings, measure_signal
from voicebias.instruments.formants import MALE_FORMANT_NORMS
from voicebias.stimuli import continuum as cm


def _table(path) -> pd.DataFrame:
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[0][:1] in "mw" and parts[0][1:3].isdigit():
            rows.append(
                {
                    "group": parts[0][0],
                    "f0": float(parts[2]),
                    "f1": float(parts[3]),
                    "f2": float(parts[4]),
                    "f3": float(parts[5]),
                }
            )
    return pd.DataFrame(rows)


def test_the_endpoints_are_hillenbrands_geometric_means():
    # the full published table (45 men, 48 women), not the subset of recordings shipped with the tests
    t = _table(HILLENBRAND / "orig_vowdata.dat")
    assert t.loc[t["group"] == "m", "f0"].count() == 45 * 12

    def gmean(group, col):
        v = t.loc[(t["group"] == group) & (t[col] > 0), col]
        return math.exp(np.log(v).mean())

    assert cm.HILLENBRAND_MEN_F0_HZ == pytest.approx(gmean("m", "f0"), abs=0.05)
    assert cm.HILLENBRAND_WOMEN_F0_HZ == pytest.approx(gmean("w", "f0"), abs=0.05)
    ratio = 2 ** np.mean([math.log2(gmean("w", c) / gmean("m", c)) for c in ("f1", "f2", "f3")])
    assert cm.HILLENBRAND_FORMANT_RATIO == pytest.approx(ratio, abs=5e-4)
    men = np.mean([math.log2(gmean("m", c) / n) for c, n in zip(("f1", "f2", "f3"), MALE_FORMANT_NORMS)])
    assert cm.HILLENBRAND_MEN_FORMANT_INDEX == pytest.approx(men, abs=5e-4)


def test_targets_are_equal_steps_between_the_endpoints_and_f0_only_keeps_the_formants():
    c = cm.Continuum()
    t = c.targets(base_formant_index=-0.05)
    assert t["f0_target_hz"].iloc[0] == pytest.approx(cm.HILLENBRAND_MEN_F0_HZ)
    assert t["f0_target_hz"].iloc[-1] == pytest.approx(cm.HILLENBRAND_WOMEN_F0_HZ)
    np.testing.assert_allclose(np.diff(12 * np.log2(t["f0_target_hz"])), c.span_st / 6, rtol=1e-12)
    np.testing.assert_allclose(np.diff(t["formant_index_target"]), math.log2(cm.HILLENBRAND_FORMANT_RATIO) / 6)
    assert t["formant_index_target"].iloc[-1] == pytest.approx(
        cm.HILLENBRAND_MEN_FORMANT_INDEX + math.log2(cm.HILLENBRAND_FORMANT_RATIO)
    )
    f0_only = cm.Continuum.from_params({"variant": "f0_only"})
    assert (f0_only.targets(base_formant_index=-0.05)["formant_index_target"] == -0.05).all()
    with pytest.raises(ValueError, match="variant"):
        cm.Continuum.from_params({"variant": "formants_only"})


def _reader(sex: str, k: int) -> tuple[np.ndarray, int]:
    ref = pd.read_csv(LIBRISPEECH / "reference.csv")
    row = ref[(ref["sex"] == sex) & (ref["minutes"] > 20)].iloc[k]
    x, sr = sf.read(LIBRISPEECH / row["file"])
    return x[: 8 * sr], sr  # 8 s of read speech


@pytest.mark.parametrize("sex,k", [("M", 0), ("M", 1), ("F", 2)])
def test_steps_of_real_read_speech_land_on_their_targets(sex, k):
    x, sr = _reader(sex, k)
    audio, steps = cm.make_continuum(x, sr, cm.Continuum(), MeasureSettings())
    checked = cm.manipulation_check(steps)
    assert len(audio) == 7 and all(len(a) == len(x) for a in audio)
    assert checked["passed"].all(), checked[["step", "f0_error_st", "formant_error_oct", "reason"]]
    assert checked["f0_error_st"].abs().max() < cm.F0_TOLERANCE_ST
    assert (np.diff(checked["f0_hz"]) > 0).all() and (np.diff(checked["formant_index"]) > 0).all()
    # measured again from the audio itself, not from the table
    again = measure_signal(audio[3], sr, MeasureSettings(voice_quality=False))
    assert again["f0_median_hz"] == pytest.approx(steps["f0_hz"].iloc[3], rel=1e-9)


def test_the_check_counts_off_target_out_of_order_and_unmeasurable_steps():
    c = cm.Continuum()
    t = c.targets(base_formant_index=0.0).assign(
        f0_hz=lambda d: d["f0_target_hz"], formant_index=lambda d: d["formant_index_target"]
    )
    t.loc[2, "f0_hz"] *= 2 ** (1.0 / 12)  # 1 st sharp: off target, and above step 3
    t.loc[4, "formant_index"] -= 0.1  # formants 0.1 octave low: off target and below step 3
    t.loc[6, "f0_hz"] = np.nan
    out = cm.manipulation_check(t).set_index("step")
    assert out["passed"].tolist() == [True, True, False, True, False, True, False]
    assert out.loc[2, "reason"] == "f0_off_target"
    assert out.loc[4, "reason"] == "formant_off_target, not_monotone"
    assert out.loc[6, "reason"] == "unmeasurable"
    # a step that is on target but not above the last passing one is out of order
    t2 = c.targets(base_formant_index=0.0).assign(
        f0_hz=lambda d: d["f0_target_hz"], formant_index=lambda d: d["formant_index_target"]
    )
    t2.loc[2, "formant_index"] += 0.02  # both within 0.03 of their targets, 0.035 apart
    t2.loc[3, "formant_index"] -= 0.02
    assert cm.manipulation_check(t2).set_index("step").loc[3, "reason"] == "not_monotone"


def test_a_step_is_the_same_samples_every_time_it_is_made():
    # Praat's own "Change gender" restores the duration by PSOLA, which draws random numbers
    x, sr = _reader("M", 0)
    a = cm.change_gender(x, sr, 1.12, 175.0)
    assert np.array_equal(a, cm.change_gender(x, sr, 1.12, 175.0)) and len(a) == len(x)


def test_wsola_keeps_the_pitch_and_stretches_the_time():
    sr = 16000
    t = np.arange(sr) / sr
    x = np.sin(2 * np.pi * 150 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))  # a 3 Hz envelope
    for stretch in (0.85, 1.2):
        y = cm.wsola(x, sr, stretch)
        assert len(y) == round(sr * stretch)
        spectrum = np.abs(np.fft.rfft(y * np.hanning(len(y))))
        assert np.fft.rfftfreq(len(y), 1 / sr)[spectrum.argmax()] == pytest.approx(150, abs=1.5)
        env = np.abs(np.fft.rfft(np.abs(y) - np.abs(y).mean()))
        f_env = np.fft.rfftfreq(len(y), 1 / sr)[1 + env[1:200].argmax()]
        assert f_env == pytest.approx(3 / stretch, abs=0.5)  # the envelope slows down with the stretch


def _wsola_numpy(x, sr, stretch, frame_s=0.04, tolerance_s=0.01):
    """WSOLA written out with NumPy (every candidate frame correlated at once): the reference the
    compiled frame search must match frame for frame."""
    n = int(round(frame_s * sr)) // 2 * 2
    hs, ha, tol = n // 2, n // 2 / stretch, int(round(tolerance_s * sr))
    win = np.hanning(n + 1)[:n]
    out_len = int(round(len(x) * stretch))
    frames = int(np.ceil(out_len / hs)) + 1
    tail = max(0, int(np.ceil(frames * ha)) - len(x)) + 2 * n + tol
    pad = np.concatenate([np.zeros(tol + n), x, np.zeros(tail)])
    off = tol + n
    y, norm, prev = np.zeros(frames * hs + n), np.zeros(frames * hs + n), None
    for m in range(frames):
        nominal = int(round(m * ha))
        if prev is None:
            start = nominal
        else:
            target = pad[off + prev + hs : off + prev + hs + n] * win
            lo = nominal - tol
            cands = np.lib.stride_tricks.sliding_window_view(pad[off + lo : off + lo + n + 2 * tol], n)
            start = lo + int(np.argmax(cands @ target))
        y[m * hs : m * hs + n] += win * pad[off + start : off + start + n]
        norm[m * hs : m * hs + n] += win
        prev = start
    norm[norm < 1e-8] = 1.0
    return (y / norm)[:out_len]


@pytest.mark.parametrize("sex", ["M", "F"])
def test_compiled_wsola_picks_the_frames_numpy_picks_on_real_speech(sex):
    x, sr = _reader(sex, 0)
    for stretch in (0.87, 1.157):
        got, ref = cm.wsola(x, sr, stretch), _wsola_numpy(np.asarray(x, float), sr, stretch)
        assert got.shape == ref.shape and np.allclose(got, ref, rtol=0, atol=1e-12)


def test_change_gender_equals_praats_own_manipulation_with_its_second_pitch_analysis():
    """change_gender builds the Manipulation from the Pitch it takes the median from ("Sound & Pitch:
    To Manipulation"); Praat's "Sound: To Manipulation" runs that analysis again itself. On real
    read speech both give the same samples."""
    import parselmouth
    from parselmouth.praat import call

    x, sr = _reader("F", 0)
    k, f0 = 0.93, 150.0
    snd = parselmouth.Sound(cm.wsola(x, sr, k), float(sr))
    snd = call(snd, "Resample", sr / k, 50)
    call(snd, "Override sampling frequency", float(sr))
    floor, ceiling = cm.PITCH_RANGE_HZ[0] * k, cm.PITCH_RANGE_HZ[1]
    median = call(call(snd, "To Pitch", 0.01, floor, ceiling), "Get quantile", 0, 0, 0.5, "Hertz")
    manip = call(snd, "To Manipulation", 0.01, floor, ceiling)
    tier = call(manip, "Extract pitch tier")
    call(tier, "Multiply frequencies", snd.xmin, snd.xmax, f0 / median)
    call([tier, manip], "Replace pitch tier")
    ref = np.asarray(call(manip, "Get resynthesis (overlap-add)").values[0], float)[: len(x)]
    assert np.array_equal(cm.change_gender(x, sr, k, f0), ref)
