"""Acoustic measures on synthetic signals with known answers, and eSpeak NG voices."""

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
from scipy.signal import lfilter

from voicebias.instruments.acoustics import MEASURE_COLUMNS, MeasureSettings, measure_files, measure_signal
from voicebias.audio import AudioError
from voicebias.instruments.classifiers import AcousticNormsClassifier
from voicebias.tts import get_backend

SR = 16000


def vowel(f0=120.0, formants=(700.0, 1220.0, 2600.0, 3300.0, 3750.0), bandwidths=(80.0, 90.0, 120.0, 150.0, 200.0),
          dur=1.0, jitter=0.0):
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
    m = measure_signal((0.3 * x / np.max(np.abs(x))).astype(np.float32), sr, MeasureSettings(floor, ceiling, 5500.0, 0.01))
    out[name] = {k: float(v).hex() for k, v in m.items()}
json.dump(out, open(sys.argv[1], "w"))
"""


def test_measures_are_the_same_on_avx2_and_avx512_code_paths(tmp_path):
    """The same bytes on every x86-64 machine: on an AVX-512 CPU, a process that keeps
    NumPy and OpenBLAS to their AVX2 code and compiles the instrument's loops for an
    AVX2 processor (Haswell) measures every component of two voices bit for bit as the
    native process does."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.isa import AVX2_CODE_PATHS as avx2, require_avx512

    require_avx512()
    base = {k: v for k, v in os.environ.items() if k not in avx2 and k != "NUMBA_CACHE_DIR"}
    script = tmp_path / "measure_one.py"
    script.write_text(_MEASURE_ONE)
    out = {}
    for name, env in (("native", base), ("avx2", {**base, **avx2})):
        out[name] = tmp_path / f"{name}.json"
        subprocess.run([sys.executable, str(script), str(out[name])], check=True, capture_output=True, text=True,
                       env={**env, "NUMBA_CACHE_DIR": str(tmp_path / f"numba-{name}")},
                       cwd=Path(__file__).resolve().parents[3])
    native, emulated = json.loads(out["native"].read_text()), json.loads(out["avx2"].read_text())
    assert all(float.fromhex(v) == float.fromhex(v) for v in native["male"].values())   # every measure defined
    assert native == emulated
