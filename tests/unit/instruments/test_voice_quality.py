"""Voice-quality measures against closed forms: harmonic complexes with set amplitudes,
resonator vowels whose source spectrum is known, and noisy twins."""

import numpy as np
import pytest
from scipy.signal import freqz, lfilter

from voicebias.instruments.acoustics import MeasureSettings, measure_signal
from voicebias.instruments.cpps import voiced_intervals
from voicebias.instruments.harmonics import hawks_miller_bandwidth, iseli_correction_db

SR = 16000


def harmonic_complex(f0, levels_db, dur=1.0):
    """Sum of harmonics k*f0 with the given levels (dB re harmonic 1) and fixed phases."""
    t = np.arange(int(dur * SR)) / SR
    y = sum(
        10 ** (a / 20) * np.sin(2 * np.pi * (k + 1) * f0 * t + 0.3 * k)
        for k, a in enumerate(levels_db)
        if (k + 1) * f0 < SR / 2
    )
    return (0.3 * y / np.max(np.abs(y))).astype(np.float32)


def resonator_vowel(f0, formants, bandwidths, dur=1.0):
    """Impulse train with an exact period (f0 divides the rate) -> glottal roll-off
    1/(1 - 0.97 z^-1) -> unit-DC-gain resonators. Source level of harmonic k is
    G(k f0) = -20 log10 |1 - 0.97 exp(-j 2 pi k f0 / fs)| dB plus a constant."""
    src = np.zeros(int(dur * SR))
    src[:: int(round(SR / f0))] = 1.0
    y = lfilter([1.0], [1.0, -0.97], src)
    for f, bw in zip(formants, bandwidths):
        r = np.exp(-np.pi * bw / SR)
        a = [1.0, -2 * r * np.cos(2 * np.pi * f / SR), r * r]
        y = lfilter([sum(a)], a, y)
    return (0.5 * y / np.max(np.abs(y))).astype(np.float32)


def source_db(f):
    return -20 * np.log10(np.abs(1 - 0.97 * np.exp(-2j * np.pi * np.asarray(f) / SR)))


@pytest.mark.parametrize("f0,h2_db", [(90.0, -10.0), (120.0, -6.0), (220.0, 3.0)])
def test_h1_h2_on_set_harmonic_amplitudes(f0, h2_db):
    x = harmonic_complex(f0, [0.0, h2_db] + [-20.0] * 80)
    m = measure_signal(x, SR, MeasureSettings(60, 400, 5000, 0.01))
    assert m["f0_median_hz"] == pytest.approx(f0, rel=0.01)
    assert m["h1_h2_db"] == pytest.approx(-h2_db, abs=0.5)
    assert m["h1_h2_db"] == pytest.approx(-h2_db, abs=0.05)  # in practice far tighter


def test_iseli_correction_is_the_resonator_response():
    """The correction is exactly the magnitude response (dB) of the digital resonator used
    to synthesise: checked against scipy's freqz."""
    f = np.array([100.0, 250.0, 700.0, 1300.0, 2500.0, 5000.0])
    for F, B in ((700.0, 80.0), (2600.0, 150.0)):
        r = np.exp(-np.pi * B / SR)
        a = [1.0, -2 * r * np.cos(2 * np.pi * F / SR), r * r]
        _, h = freqz([sum(a)], a, worN=f, fs=SR)
        np.testing.assert_allclose(iseli_correction_db(f, F, B, SR), 20 * np.log10(np.abs(h)), atol=1e-9)
    assert iseli_correction_db(0.0, 700.0, 80.0, SR) == pytest.approx(0.0, abs=1e-12)


def test_hawks_miller_bandwidths():
    # the two polynomial branches meet at 500 Hz (a mistyped coefficient would break this)
    low = hawks_miller_bandwidth(499.999, 132.0)
    high = hawks_miller_bandwidth(500.0, 132.0)
    assert low == pytest.approx(high, abs=1.0) and 30 < high < 45
    # f0 scaling S = 1 + 0.25 (f0 - 132) / 88
    assert hawks_miller_bandwidth(1500.0, 220.0) / hawks_miller_bandwidth(1500.0, 132.0) == pytest.approx(1.25)
    assert np.all(np.diff(hawks_miller_bandwidth(np.array([1000.0, 2000.0, 3000.0]), 132.0)) > 0)


@pytest.mark.parametrize(
    "f0,formants",
    [
        (100.0, (500.0, 1500.0, 2500.0, 3500.0, 4500.0)),
        (125.0, (700.0, 1220.0, 2600.0, 3300.0, 3750.0)),
    ],
)
def test_corrected_measures_recover_the_source_spectrum(f0, formants):
    bandwidths = [float(hawks_miller_bandwidth(f, f0)) for f in formants]
    m = measure_signal(resonator_vowel(f0, formants, bandwidths), SR, MeasureSettings(60, 300, 5000, 0.01))

    def boost(f, which):
        return sum(iseli_correction_db(f, formants[i], bandwidths[i], SR) for i in which)

    k3 = int(round(formants[2] / f0)) * f0  # the harmonic nearest F3
    every = range(5)
    # uncorrected: source plus every resonance, read off the filtered spectrum
    assert m["h1_h2_db"] == pytest.approx(
        source_db(f0) - source_db(2 * f0) + boost(f0, every) - boost(2 * f0, every), abs=0.1
    )
    assert m["h1_a3_db"] == pytest.approx(source_db(f0) - source_db(k3) + boost(f0, every) - boost(k3, every), abs=0.3)
    # corrected: H1*, H2* lose F1 and F2; A3* loses F1-F3 (F4, F5 stay, as in VoiceSauce)
    h1h2_star = source_db(f0) - source_db(2 * f0) + boost(f0, (2, 3, 4)) - boost(2 * f0, (2, 3, 4))
    h1a3_star = source_db(f0) - source_db(k3) + boost(f0, (2, 3, 4)) - boost(k3, (3, 4))
    assert m["h1_h2_corrected_db"] == pytest.approx(h1h2_star, abs=0.5)
    assert m["h1_a3_corrected_db"] == pytest.approx(h1a3_star, abs=1.5)
    # and the correction does move the values (F1 near H2 matters)
    assert abs(m["h1_h2_corrected_db"] - m["h1_h2_db"]) > 1.0


def test_measured_bandwidth_option():
    f0, formants = 125.0, (700.0, 1220.0, 2600.0, 3300.0, 3750.0)
    bandwidths = [float(hawks_miller_bandwidth(f, f0)) for f in formants]
    x = resonator_vowel(f0, formants, bandwidths)
    m = measure_signal(x, SR, MeasureSettings(60, 300, 5000, 0.01, bandwidths="measured"))
    assert np.isfinite(m["h1_h2_corrected_db"]) and np.isfinite(m["h1_a3_corrected_db"])
    with pytest.raises(ValueError, match="hawks_miller.*measured"):
        measure_signal(x, SR, MeasureSettings(60, 300, 5000, 0.01, bandwidths="guess"))


def test_cpps_and_hnr_drop_for_the_noisy_twin():
    clean = resonator_vowel(125.0, (700.0, 1220.0, 2600.0, 3300.0, 3750.0), (80.0, 90.0, 120.0, 150.0, 200.0))
    noisy = clean + np.random.default_rng(1).normal(0, 0.05, clean.size).astype(np.float32)
    s = MeasureSettings(60, 300, 5000, 0.01)
    mc, mn = measure_signal(clean, SR, s), measure_signal(noisy, SR, s)
    assert mn["cpps_db"] < mc["cpps_db"] - 3.0
    assert mn["hnr_db"] < mc["hnr_db"] - 10.0
    # white noise of known power: HNR reads the signal-to-noise ratio (dB)
    snr = 10 * np.log10(np.mean(clean.astype(float) ** 2) / 0.05**2)
    assert mn["hnr_db"] == pytest.approx(snr, abs=1.5)
    assert mn["h1_h2_db"] == pytest.approx(mc["h1_h2_db"], abs=0.5)  # harmonics stand well above this noise


def test_cpps_ignores_pauses():
    """CPPS is taken over the voiced stretches only, so a pause does not lower it."""
    v = harmonic_complex(150.0, [0.0, -3.0] + [-12.0] * 50, dur=0.6)
    pause = np.zeros(int(0.8 * SR), dtype=np.float32)
    s = MeasureSettings(60, 400, 5000, 0.01)
    joined = measure_signal(np.concatenate([v, pause, v]), SR, s)
    alone = measure_signal(np.concatenate([v, v]), SR, s)
    assert joined["voiced_fraction"] < 0.7
    assert joined["cpps_db"] == pytest.approx(alone["cpps_db"], abs=1.0)


def test_voiced_intervals():
    times = np.arange(10) * 0.01 + 0.005
    voiced = np.array([0, 1, 1, 1, 0, 0, 1, 1, 0, 1], bool)
    np.testing.assert_allclose(voiced_intervals(times, voiced, 0.01), [(0.01, 0.04), (0.06, 0.08), (0.09, 0.10)])
    np.testing.assert_allclose(voiced_intervals(times, voiced, 0.01, min_duration=0.025), [(0.01, 0.04)])


def _voice(f0, dur, noise, seed):
    t = np.arange(int(dur * SR)) / SR
    vib = f0 * (1 + 0.03 * np.sin(2 * np.pi * 5 * t))
    phase = 2 * np.pi * np.cumsum(vib) / SR
    y = sum(np.sin(k * phase) / k for k in range(1, int(7000 / f0)))
    return y + noise * np.random.default_rng(seed).standard_normal(len(t))


@pytest.mark.parametrize("f0,noise", [(95.0, 0.0), (130.0, 0.05), (210.0, 0.2), (320.0, 1.0)])
@pytest.mark.parametrize("time_step,quefrency_window", [(0.002, 0.0005), (0.005, 0.0005), (0.01, 0.001)])
def test_cepstrogram_cpps_equals_praats_get_cpps(f0, noise, time_step, quefrency_window):
    """The NumPy evaluation of Get CPPS gives Praat's number on voices from clean to
    noisy, at the time steps the params allow and another quefrency window."""
    import parselmouth

    from voicebias.instruments.cpps import CPPSSettings, cpps_db, praat_cpps_db

    snd = parselmouth.Sound(_voice(f0, 1.3, noise, seed=int(f0)), sampling_frequency=SR)
    st = CPPSSettings(time_step=time_step, quefrency_averaging_window=quefrency_window)
    assert cpps_db(snd, None, st) == pytest.approx(praat_cpps_db(snd, st), abs=1e-9)


@pytest.mark.parametrize("dur", [0.06, 0.1, 0.104, 0.13, 0.25])
def test_cepstrogram_cpps_equals_praat_on_short_sounds(dur):
    """Sounds at or below Praat's 0.1-s cepstrogram window (one frame, window cut to the
    sound) and a few frames long, where every averaging window meets an edge."""
    import parselmouth

    from voicebias.instruments.cpps import CPPSSettings, cpps_db, praat_cpps_db

    snd = parselmouth.Sound(_voice(140.0, dur, 0.1, seed=3), sampling_frequency=SR)
    for time_step in (0.002, 0.005, 0.03):
        st = CPPSSettings(time_step=time_step)
        assert cpps_db(snd, None, st) == pytest.approx(praat_cpps_db(snd, st), abs=1e-9)


def _reference_levels(x, t, f0, f3):
    """H1, H2 and A3 (dB) of one frame as voicebias defines them, written out plainly: a
    Hann window of 6 periods at the frame, zero-padded to a power of two at least eight
    times as long, 20 log10 |X| at the bins within f0 +- 10 %, 2 f0 +- 10 % and F3 +- 10 %,
    the highest of each refined by a parabola through it and its neighbours."""
    n = int(round(6 * SR / f0))
    start = int(round(t * SR)) - n // 2
    nfft = 1 << int(np.ceil(np.log2(8 * n)))
    spec = np.abs(np.fft.rfft(x[start : start + n] * np.hanning(n), nfft))
    freqs = np.fft.rfftfreq(nfft, 1.0 / SR)
    level = 20 * np.log10(np.maximum(spec, 1e-12))
    out = []
    for lo, hi in ((0.9 * f0, 1.1 * f0), (1.9 * f0, 2.1 * f0), (0.9 * f3, 1.1 * f3)):
        band = np.flatnonzero((freqs >= lo) & (freqs <= hi))
        k = band[np.argmax(level[band])]
        a, b, c = level[k - 1], level[k], level[k + 1]
        p = 0.5 * (a - c) / (a - 2 * b + c) if a - 2 * b + c < 0 else 0.0
        out.append(b - 0.25 * (a - c) * p)
    return out


def test_harmonic_levels_follow_their_definition_frame_by_frame():
    """The batched, compiled peak search gives, on every frame of a voice with vibrato
    (frames of three FFT lengths), the levels the plain definition gives."""
    from voicebias.instruments.harmonics import harmonic_levels

    x = _voice(120.0, 1.0, 0.01, seed=5) + 0.5 * _voice(91.0, 1.0, 0.0, seed=6)
    times = np.arange(0.1, 0.9, 0.01)
    f0 = 120.0 * (1 + 0.6 * np.sin(2 * np.pi * times))  # 48-192 Hz: 4096- to 16384-point frames
    formants = np.tile([600.0, 1500.0, 2500.0], (len(times), 1))
    got = harmonic_levels(x, SR, times, f0, formants)
    want = np.array([_reference_levels(x, t, f, 2500.0) for t, f in zip(times, f0)])
    assert len(np.unique([1 << int(np.ceil(np.log2(8 * round(6 * SR / f)))) for f in f0])) == 3
    np.testing.assert_allclose(got[["h1_db", "h2_db", "a3_db"]].to_numpy(), want, rtol=0, atol=1e-9)


def test_the_median_near_a_guess_is_the_exact_median():
    """Medians of drifting, tied, even and odd sets, looked for near the previous one as
    the CPPS frames are, equal numpy's median exactly (found in the window or not)."""
    from voicebias.instruments.cpps import _median_near

    rng = np.random.default_rng(3)
    near, scratch = np.array([np.nan, 0.0]), np.empty(600)
    level = 0.0
    for i in range(2000):
        n = (256, 513, 1, 2, 7, 64)[i % 6]
        level += rng.normal(0, 0.1) if i % 97 else 50.0  # now and then a jump the window misses
        a = level + rng.standard_normal(n) * (0.01, 1.0, 30.0)[i % 3]
        if i % 11 == 0:
            a[: n // 2] = a[-1]  # ties
        assert _median_near(a.copy(), n, near, scratch) == np.median(a)
