"""Bad audio: each case gets a specific error, or a counted conversion, and the rest of
the batch is still measured."""

import numpy as np
import pandas as pd
import pytest
import soundfile as sf
from scipy.signal import lfilter

from voicebias.audio import AudioError, load_for_analysis, read_audio, resample
from voicebias.instruments.acoustics import MeasureSettings, exclusion_counts, measure_file, measure_files

SR = 16000
SETTINGS = MeasureSettings(60, 300, 5000, 0.01)


def vowel(f0=120.0, dur=1.0, sr=SR, peak=0.5):
    n = int(dur * sr)
    src = np.zeros(n)
    src[:: int(round(sr / f0))] = 1.0
    y = lfilter([1.0], [1.0, -0.97], src)
    for f, bw in zip((700.0, 1220.0, 2600.0, 3300.0), (80.0, 90.0, 120.0, 150.0)):
        r = np.exp(-np.pi * bw / sr)
        a = [1.0, -2 * r * np.cos(2 * np.pi * f / sr), r * r]
        y = lfilter([sum(a)], a, y)
    return (peak * y / np.max(np.abs(y))).astype(np.float32)


def refused(path, code, match, settings=SETTINGS):
    with pytest.raises(AudioError, match=match) as err:
        measure_file(path, settings, SR)
    assert err.value.code == code
    return err.value


def test_empty_file(tmp_path):
    p = tmp_path / "empty.wav"
    sf.write(p, np.zeros(0, np.float32), SR)
    refused(p, "empty", "holds no samples")


def test_silent_file(tmp_path):
    p = tmp_path / "silent.flac"
    sf.write(p, np.zeros(SR, np.float32), SR)
    refused(p, "silent", r"silent \(RMS -inf dBFS, below -60 dBFS\)")
    quiet = tmp_path / "hiss.flac"
    sf.write(quiet, np.random.default_rng(0).normal(0, 1e-4, SR).astype(np.float32), SR)  # -80 dBFS
    refused(quiet, "silent", r"silent \(RMS -80")


def test_clipped_file(tmp_path):
    p = tmp_path / "clipped.wav"
    sf.write(p, np.clip(4 * vowel(), -1, 1), SR, subtype="FLOAT")
    e = refused(p, "clipped", r"clipped: \d+\.\d\d% of samples at full scale \(more than 0.1% allowed\)")
    assert float(str(e).split("clipped: ")[1].split("%")[0]) > 1.0
    # a peak that just touches full scale on a few samples is tolerated
    ok = tmp_path / "touch.wav"
    sf.write(ok, vowel(peak=1.0), SR, subtype="FLOAT")
    assert measure_file(ok, SETTINGS, SR)["f0_median_hz"] == pytest.approx(120, rel=0.01)


def test_nan_samples(tmp_path):
    x = vowel()
    x[100:103] = np.nan
    x[500] = np.inf
    p = tmp_path / "nan.wav"
    sf.write(p, x, SR, subtype="FLOAT")
    refused(p, "nan", r"NaN or infinity \(4 of 16000\)")


def test_stereo_is_averaged_to_mono_and_noted(tmp_path):
    x = vowel()
    p = tmp_path / "stereo.wav"
    sf.write(p, np.stack([x, 0.5 * x], axis=1), SR)
    m = measure_file(p, SETTINGS, SR)
    assert m["note"] == "2 channels averaged to mono"
    assert m["f0_median_hz"] == pytest.approx(120, rel=0.01)
    loaded = load_for_analysis(p, SR)
    np.testing.assert_allclose(loaded.x, 0.75 * x, atol=1e-4)  # 16-bit quantisation
    inverted = tmp_path / "inverted.wav"
    sf.write(inverted, np.stack([x, -x], axis=1), SR, subtype="FLOAT")
    refused(inverted, "stereo_cancels", "channels cancel when averaged to mono")


def test_8khz_is_refused_for_lacking_the_formant_band(tmp_path):
    p = tmp_path / "phone.wav"
    sf.write(p, vowel(sr=8000), 8000)
    refused(p, "low_sample_rate", r"sample rate 8000 Hz is too low: the analysis needs at least 10000 Hz")
    # read_audio alone (no analysis) still reads it
    assert read_audio(p)[1] == 8000


def test_48khz_is_resampled_and_noted(tmp_path):
    p = tmp_path / "studio.flac"
    sf.write(p, vowel(sr=48000), 48000)
    m = measure_file(p, SETTINGS, SR)
    assert m["note"] == "resampled from 48000 Hz to 16000 Hz"
    native = measure_file(_write(tmp_path / "native.flac", resample(vowel(sr=48000), 48000, SR)), SETTINGS, SR)
    assert m["f0_median_hz"] == pytest.approx(native["f0_median_hz"], rel=0.005)
    assert m["f1_hz"] == pytest.approx(native["f1_hz"], rel=0.01)
    assert m["h1_h2_db"] == pytest.approx(native["h1_h2_db"], abs=0.1)


def test_very_long_file_is_refused_before_decoding(tmp_path):
    p = tmp_path / "long.flac"
    sf.write(p, np.zeros(601 * SR, np.int16), SR, subtype="PCM_16")  # 10 min 1 s of (compressible) silence
    refused(p, "too_long", r"too long \(601 s > 600 s allowed\)")
    short_limit = MeasureSettings(60, 300, 5000, 0.01, max_duration_s=0.5)
    refused(_write(tmp_path / "v.flac", vowel()), "too_long", r"too long \(1 s > 0.5 s", short_limit)


def test_truncated_files(tmp_path):
    for ext in ("wav", "flac"):
        p = _write(tmp_path / f"cut.{ext}", vowel(dur=2.0))
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 2])
        refused(p, "truncated", "truncated")
    # the WAV header's declared size is what gives it away (libsndfile would read half)
    wav = tmp_path / "cut.wav"
    with pytest.raises(AudioError, match=r"header declares 64000 bytes of audio, the file holds 31978"):
        read_audio(wav)


def test_non_audio_file(tmp_path):
    p = tmp_path / "notes.wav"
    p.write_text("these are my notes, not a recording", encoding="utf-8")
    refused(p, "not_audio", "not a readable audio file")


def _write(path, x, sr=SR):
    sf.write(path, x, sr)
    return path


def test_a_batch_with_every_case_measures_the_good_files_and_counts_the_rest(tmp_path):
    good = [_write(tmp_path / f"good{i}.flac", vowel(100 + 30 * i)) for i in range(3)]
    cases = {
        "empty": _write(tmp_path / "e.wav", np.zeros(0, np.float32)),
        "silent": _write(tmp_path / "s.flac", np.zeros(SR, np.float32)),
        "clipped": _write(tmp_path / "c.flac", np.clip(4 * vowel(), -1, 1)),
        "low_sample_rate": _write(tmp_path / "8k.wav", vowel(sr=8000), 8000),
        "not_audio": tmp_path / "n.wav",
        "truncated": _write(tmp_path / "t.flac", vowel(dur=2.0)),
        "missing": tmp_path / "gone.flac",
    }
    cases["not_audio"].write_text("hello")
    cases["truncated"].write_bytes(cases["truncated"].read_bytes()[:3000])
    nan = vowel()
    nan[10] = np.nan
    cases["nan"] = tmp_path / "nan.wav"
    sf.write(cases["nan"], nan, SR, subtype="FLOAT")
    stereo = _write(tmp_path / "st.wav", np.stack([vowel(), vowel()], axis=1))
    hi = _write(tmp_path / "48k.flac", vowel(sr=48000), 48000)
    jobs = [(f"good{i}", p, SETTINGS) for i, p in enumerate(good)] + [(k, p, SETTINGS) for k, p in cases.items()]
    jobs += [("stereo", stereo, SETTINGS), ("48k", hi, SETTINGS)]
    df = measure_files(jobs, SR, workers=2).set_index("id")
    ok = df[df["status"] == "ok"]
    assert sorted(ok.index) == ["48k", "good0", "good1", "good2", "stereo"]
    np.testing.assert_allclose(ok.loc[["good0", "good1", "good2"], "f0_median_hz"], [100, 130, 160], rtol=0.01)
    for code in cases:
        assert df.loc[code, "status"] == "excluded" and df.loc[code, "reason"] == code, code
        assert df.loc[code, "error"] and np.isnan(df.loc[code, "f0_median_hz"])
    counts = exclusion_counts(df.reset_index())
    excluded = counts[counts["kind"] == "excluded"].set_index("reason")["n"]
    assert excluded.to_dict() == {code: 1 for code in cases}
    notes = counts[counts["kind"] == "note"].set_index("reason")["n"].to_dict()
    assert notes == {"downmixed": 1, "resampled": 1}
    assert isinstance(counts, pd.DataFrame) and list(counts.columns) == ["kind", "reason", "n"]
