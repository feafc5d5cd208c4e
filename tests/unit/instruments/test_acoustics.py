"""Acoustic measures on synthetic signals with known answers, and eSpeak NG voices."""

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
from scipy.signal import lfilter

from voicebias.audio import AudioError
from voicebias.instruments.acoustics import MEASURE_COLUMNS, MeasureSettings, measure_files, measure_signal
from voicebias.instruments.classifiers import AcousticNormsClassifier
from voicebias.tts import get_backend

SR = 16000


def vowel(
    f0=120.0,
    formants=(700.0, 1220.0, 2600.0, 3300.0, 3750.0),
    bandwidths=(80.0, 90.0, 120.0, 150.0, 200.0),
    dur=1.0,
    jitter=0.0,
):
    """A glottal pulse train through a cascade of second-order resonators (five formants,
    as the Burg analysis expects five below its ceiling)."""
    n = int(dur * SR)
    src = np.zeros(n)
    t = 0.0
    rng = np.random.default_rng(0)
    while t < n:
        src[int(t)] = 1.0
        t += SR / f0 * (1 + jitter * rng.standard_normal())
    src = lfilter([1.0], [1.0, -0.97], src)  # glottal roll-off
    y = src
    for f, bw in zip(formants, bandwidths):
        r = np.exp(-np.pi * bw / SR)
        a = [1.0, -2 * r * np.cos(2 * np.pi * f / SR), r * r]
        y = lfilter([sum(a)], a, y)
    return (0.5 * y / np.max(np.abs(y))).astype(np.float32)


def test_f0_and_formants_on_a_synthetic_vowel():
    m = measure_signal(vowel(), SR, MeasureSettings(60, 300, 5000, 0.01))
    assert m["f0_median_hz"] == pytest.approx(120.0, rel=0.01)
    assert m["f1_hz"] == pytest.approx(700.0, rel=0.05)
    assert m["f2_hz"] == pytest.approx(1220.0, rel=0.05)
    assert m["f3_hz"] == pytest.approx(2600.0, rel=0.05)
    assert m["f0_median_st"] == pytest.approx(12 * np.log2(120 / 100), abs=0.2)
    assert m["voiced_fraction"] > 0.9


def test_formant_index_orders_vocal_tract_sizes():
    short_tract = measure_signal(vowel(210, (850, 1500, 3100, 3900, 4700)), SR, MeasureSettings(100, 500, 5500, 0.01))
    long_tract = measure_signal(vowel(110, (700, 1220, 2600, 3300, 3750)), SR, MeasureSettings(60, 300, 5000, 0.01))
    assert short_tract["formant_index"] > long_tract["formant_index"] + 0.15
    clf = AcousticNormsClassifier()
    margins = clf.margins(pd.DataFrame([short_tract, long_tract]))
    assert margins[0] > 0 > margins[1]


def test_silence_is_a_clear_error():
    with pytest.raises(AudioError, match="no voiced frames"):
        measure_signal(np.zeros(SR, dtype=np.float32), SR, MeasureSettings())


def test_bad_files_are_excluded_and_the_rest_measured(tmp_path):
    good = tmp_path / "good.flac"
    sf.write(good, vowel(), SR)
    silent = tmp_path / "silent.flac"
    sf.write(silent, np.zeros(SR, dtype=np.float32), SR)
    junk = tmp_path / "junk.flac"
    junk.write_bytes(b"not audio at all")
    s = MeasureSettings(60, 300, 5000, 0.01)
    df = measure_files([("good", good, s), ("silent", silent, s), ("junk", junk, s)], SR, workers=2).set_index("id")
    assert df.loc["good", "status"] == "ok" and df.loc["good", "f0_median_hz"] == pytest.approx(120, rel=0.01)
    assert df.loc["silent", "status"] == "excluded" and "silent" in df.loc["silent", "error"]
    assert df.loc["junk", "status"] == "excluded" and "not a readable audio file" in df.loc["junk", "error"]
    assert list(df.loc[["silent", "junk"], "reason"]) == ["silent", "not_audio"]


def test_noise_without_voicing_is_excluded_as_unvoiced():
    noise = np.random.default_rng(0).normal(0, 0.1, SR).astype(np.float32)
    with pytest.raises(AudioError, match="no voiced frames") as err:
        measure_signal(noise, SR, MeasureSettings(60, 300, 5000, 0.01))
    assert err.value.code == "no_voicing"


def test_female_vowel_f0_and_formants():
    m = measure_signal(vowel(220, (850, 1500, 3100, 3900, 4700)), SR, MeasureSettings(100, 500, 5500, 0.01))
    assert m["f0_median_hz"] == pytest.approx(220.0, rel=0.01)
    assert m["f1_hz"] == pytest.approx(850.0, rel=0.05)
    assert m["f2_hz"] == pytest.approx(1500.0, rel=0.05)
    assert m["f3_hz"] == pytest.approx(3100.0, rel=0.05)


def test_parallel_measurement_equals_serial_and_keeps_order(tmp_path):
    s = MeasureSettings(60, 400, 5000, 0.01)
    jobs = []
    for i, f0 in enumerate((100, 130, 160, 190, 220)):
        path = tmp_path / f"v{i}.flac"
        sf.write(path, vowel(f0, dur=0.6), SR)
        jobs.append((f"v{i}", path, s))
    par = measure_files(jobs, SR, workers=2)
    ser = measure_files(jobs, SR, workers=1)
    assert list(par["id"]) == [f"v{i}" for i in range(5)]
    pd.testing.assert_frame_equal(par, ser)
    np.testing.assert_allclose(par["f0_median_hz"], [100, 130, 160, 190, 220], rtol=0.01)
    assert set(MEASURE_COLUMNS) <= set(par.columns) and par[MEASURE_COLUMNS].notna().all().all()


def test_espeak_voices_are_gendered_and_deterministic():
    tts = get_backend("espeak", rate_wpm=160)
    text = "Every morning I check the rods and climb down into the hull."
    male, sr = tts.synthesize(text, "en-us+m3")
    tts.synthesize("Otra frase distinta para cambiar el estado.", "es+f3")
    female, _ = tts.synthesize(text, "en-us+f3")
    male_again, _ = tts.synthesize(text, "en-us+m3")
    # same text and voice give the same samples whatever was synthesised in between
    assert np.array_equal(male, male_again)
    fm = measure_signal(male, sr, MeasureSettings(60, 300, 5000, 0.01))
    ff = measure_signal(female, sr, MeasureSettings(100, 500, 5500, 0.01))
    assert fm["f0_median_hz"] < 120 < 150 < ff["f0_median_hz"]


def test_espeak_rejects_unknown_voice_and_empty_text():
    tts = get_backend("espeak")
    with pytest.raises(ValueError, match="no voice"):
        tts.synthesize("hello", "xx-nonexistent+m1")
    with pytest.raises(ValueError, match="empty"):
        tts.synthesize("   ", "en-us+m3")


def test_unknown_tts_backend_is_a_clear_error():
    with pytest.raises(KeyError, match="unknown TTS backend 'festival'"):
        get_backend("festival")


_MEASURE_ONE = """
import voicebias  # first, as every stage does: it fixes the code paths before NumPy loads
import json, sys
import numpy as np
from voicebias.instruments.acoustics import MeasureSettings, measure_signal
sr = 16000
t = np.arange(int(1.5 * sr)) / sr
rng = np.random.default_rng(11)
out = {}
for name, f0, floor, ceiling in (("male", 105.0, 60.0, 300.0), ("female", 215.0, 100.0, 500.0)):
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.04 * np.sin(2 * np.pi * 4 * t))) / sr
    x = sum(np.sin(k * phase + 0.3 * k) / k ** 1.5 for k in range(1, int(7000 / f0)))
    x = x * (0.6 + 0.4 * np.sin(2 * np.pi * 1.3 * t) ** 2) + 0.02 * rng.standard_normal(t.size)
    y = (0.3 * x / np.max(np.abs(x))).astype(np.float32)
    m = measure_signal(y, sr, MeasureSettings(floor, ceiling, 5500.0, 0.01))
    out[name] = {k: float(v).hex() for k, v in m.items()}
json.dump(out, open(sys.argv[1], "w"))
"""


def test_measures_are_the_same_on_avx2_and_avx512_code_paths(tmp_path):
    """The same bytes on every x86-64 machine: on an AVX-512 CPU, a process with
    voicebias's fixed code paths (the default) measures every component of two voices bit
    for bit as an AVX2-only machine does on its own kernels (played with
    VOICEBIAS_CODE_PATHS=native, NumPy and OpenBLAS kept to their AVX2 code and the loops
    compiled for Haswell). NumPy's AVX-512 loops alone would not: with native paths on
    both sides the measures differ in their last bits, which is why the paths are fixed."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.support.isa import AVX2_CODE_PATHS as avx2
    from tests.support.isa import require_avx512

    require_avx512()
    base = {k: v for k, v in os.environ.items() if k not in avx2 and k != "NUMBA_CACHE_DIR"}
    script = tmp_path / "measure_one.py"
    script.write_text(_MEASURE_ONE)
    out = {}
    for name, env in (("native", base), ("avx2", {**base, **avx2})):
        out[name] = tmp_path / f"{name}.json"
        subprocess.run(
            [sys.executable, str(script), str(out[name])],
            check=True,
            capture_output=True,
            text=True,
            env={**env, "NUMBA_CACHE_DIR": str(tmp_path / f"numba-{name}")},
            cwd=Path(__file__).resolve().parents[3],
        )
    native, emulated = json.loads(out["native"].read_text()), json.loads(out["avx2"].read_text())
    # every measure defined, so that the comparison is not of NaNs; but f4_hz: this source has no
    # resonances, and LPC finds a fourth formant below the 5500 Hz ceiling in too few frames (f4_hz is
    # NaN by design then, voicebias.instruments.formants)
    for voice in native.values():
        assert all(float.fromhex(v) == float.fromhex(v) for k, v in voice.items() if k != "f4_hz"), voice
    assert native == emulated


# ---------------------------------------------------------------------------
# very short audio, and one file's error as that file's row


def tone(n, f0=150.0):
    """n samples of a 150 Hz tone at 16 kHz, starting at its peak (so even one sample is not silent)."""
    return (0.3 * np.cos(2 * np.pi * f0 * np.arange(n) / SR)).astype(np.float32)


def praat_frames(n, settings):
    """Frames Praat's own pitch analysis gives n samples of the tone (0 when it refuses the sound)."""
    import parselmouth

    snd = parselmouth.Sound(tone(n).astype(np.float64), sampling_frequency=SR)
    try:
        return snd.to_pitch(settings.time_step, settings.pitch_floor, settings.pitch_ceiling).n_frames
    except parselmouth.PraatError:
        return 0


@pytest.mark.parametrize(
    "settings",
    [
        MeasureSettings(),
        MeasureSettings(75, 500, 5500, 0.01),
        MeasureSettings(100, 500, 5500, 0.01),
        MeasureSettings(60, 300, 5500, 0.005),
    ],
    ids=["floor60", "floor75", "floor100", "floor60-step5ms"],
)
def test_too_short_is_where_praats_pitch_analysis_gives_fewer_than_three_frames(settings):
    """The minimum follows Praat: below it Praat refuses the sound or finds fewer than three
    frames; from it on the whole measure set runs (a tone: every component ok)."""
    from voicebias.instruments.acoustics import min_duration_s, pitch_frames

    edge = int(np.ceil(min_duration_s(settings) * SR))
    for n in (1, 100, 700, 800, *range(edge - 3, edge + 4)):
        assert pitch_frames(n, SR, settings) == praat_frames(n, settings), n
        if praat_frames(n, settings) < 3:
            with pytest.raises(AudioError, match="too short to measure") as err:
                measure_signal(tone(n), SR, settings)
            assert err.value.code == "too_short"
        else:
            m = measure_signal(tone(n), SR, settings)
            assert m["f0_median_hz"] == pytest.approx(150.0, rel=0.01) and np.isfinite(m["hnr_db"])
    assert praat_frames(edge - 2, settings) < 3 <= praat_frames(edge + 1, settings)


def test_the_documented_minimum_durations():
    from voicebias.instruments.acoustics import min_duration_s

    # 3 periods of the floor + 2 time steps: 50 + 20 ms, 30 + 20 ms
    assert min_duration_s(MeasureSettings(60, 300, 5500, 0.01)) == pytest.approx(0.070, abs=1e-12)
    assert min_duration_s(MeasureSettings(100, 500, 5500, 0.01)) == pytest.approx(0.050, abs=1e-12)


@pytest.fixture()
def mixed_batch(tmp_path):
    """Good vowels, tones of 1, 100, 700 and 800 samples, a folder, an empty file and text named .wav."""
    files = {}
    for name, f0 in (("good1", 120.0), ("good2", 200.0)):
        files[name] = tmp_path / f"{name}.wav"
        sf.write(files[name], vowel(f0, dur=0.6), SR)
    for n in (1, 100, 700, 800):
        files[f"tone{n}"] = tmp_path / f"tone{n}.wav"
        sf.write(files[f"tone{n}"], tone(n), SR)
    files["folder"] = tmp_path / "folder.wav"
    files["folder"].mkdir()
    files["empty"] = tmp_path / "empty.wav"
    files["empty"].write_bytes(b"")
    files["text"] = tmp_path / "text.wav"
    files["text"].write_text("a text file, named like a WAV file\n")
    return files


EXPECTED_REASONS = {
    "tone1": "too_short",
    "tone100": "too_short",
    "tone700": "too_short",
    "tone800": "too_short",
    "folder": "not_audio",
    "empty": "not_audio",
    "text": "not_audio",
}


@pytest.mark.parametrize("workers", [1, 2], ids=["serial", "process-pool"])
def test_short_and_unreadable_files_are_their_own_rows_and_the_rest_as_if_alone(mixed_batch, workers):
    s = MeasureSettings(60, 400, 5500, 0.01)
    df = measure_files([(k, p, s) for k, p in mixed_batch.items()], SR, workers=workers).set_index("id")
    assert list(df.index) == list(mixed_batch)
    for name, reason in EXPECTED_REASONS.items():
        assert (df.loc[name, "status"], df.loc[name, "reason"]) == ("excluded", reason), name
        assert df.loc[name, MEASURE_COLUMNS].isna().all()
    assert "a folder, not an audio file" in df.loc["folder", "error"]  # not "missing"
    assert "needs at least 70.0 ms" in df.loc["tone700", "error"]
    for name in ("good1", "good2"):
        alone = measure_files([(name, mixed_batch[name], s)], SR, workers=1).set_index("id")
        pd.testing.assert_frame_equal(df.loc[[name]], alone)


def test_an_unexpected_error_in_one_file_is_that_files_row(mixed_batch, monkeypatch):
    """Whatever a file raises besides a refusal is its row (measure_error, the error's text); the
    others are measured as if alone. The error is planted in the measuring function for one signal."""
    from voicebias.audio import load_for_analysis
    from voicebias.instruments import acoustics

    real = acoustics.measure_components
    s = MeasureSettings(60, 400, 5500, 0.01)
    target = load_for_analysis(mixed_batch["good2"], SR, s.checks()).x  # the signal good2.wav is read as

    def planted(x, sr, settings, components):
        if np.array_equal(x, target):
            raise RuntimeError("planted failure\non two lines")
        return real(x, sr, settings, components)

    monkeypatch.setattr(acoustics, "measure_components", planted)
    names = ("good1", "good2", "tone100")
    df = measure_files([(k, mixed_batch[k], s) for k in names], SR, workers=1).set_index("id")
    assert (df.loc["good2", "status"], df.loc["good2", "reason"]) == ("excluded", "measure_error")
    assert df.loc["good2", "error"] == f"{mixed_batch['good2']}: RuntimeError: planted failure on two lines"
    assert df.loc["tone100", "reason"] == "too_short" and df.loc["good1", "status"] == "ok"
    monkeypatch.setattr(acoustics, "measure_components", real)
    alone = measure_files([("good1", mixed_batch["good1"], s)], SR, workers=1).set_index("id")
    pd.testing.assert_frame_equal(df.loc[["good1"]], alone)
