"""The NumPy power cepstrogram against Praat's own "To PowerCepstrogram" + "To Matrix"
(through parselmouth) on synthetic sounds: same shape, frame times and quefrency axis, and
the same values to rounding, at the rates and time steps the project uses."""

import numpy as np
import parselmouth
import pytest
from parselmouth.praat import call

from voicebias.instruments.cepstrum import power_cepstrogram
from voicebias.instruments.cpps import CPPSSettings, cepstrogram_cpps, praat_cpps_db

ARGS = (60.0, 5000.0, 50.0)  # pitch floor (Hz), maximum frequency (Hz), pre-emphasis from (Hz)
TOL = 1e-9


def voice(sr, dur, f0=120.0, noise=1e-3, seed=0):
    """Harmonics with 5-Hz vibrato falling 2 dB each, up to 0.45 sr, plus white noise."""
    t = np.arange(int(round(dur * sr))) / sr
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.05 * np.sin(2 * np.pi * 5 * t))) / sr
    y = sum(0.8**k * np.sin(k * phase + 0.3 * k) for k in range(1, int(0.45 * sr / (1.05 * f0))))
    return 0.3 * y / np.max(np.abs(y)) + noise * np.random.default_rng(seed).standard_normal(t.size)


def white(sr, dur, seed=1):
    return 0.1 * np.random.default_rng(seed).standard_normal(int(round(dur * sr)))


def with_silences(sr, dur=1.0):
    """The voice with digital silence at the start, in the middle and at the end."""
    x = voice(sr, dur)
    x[: int(0.1 * sr)] = 0.0
    x[int(0.3 * sr) : int(0.55 * sr)] = 0.0
    x[int(0.8 * sr) :] = 0.0
    return x


def praat(x, sr, time_step):
    snd = parselmouth.Sound(x, sampling_frequency=sr)
    pc = call(snd, "To PowerCepstrogram", ARGS[0], time_step, ARGS[1], ARGS[2])
    m = call(pc, "To Matrix")
    return m.values, m.x1, m.dx, (m.xmin, m.xmax), m.ymax


def compare(x, sr, time_step):
    """(Praat's matrix, ours, frame times) after checking the axes; the values are left
    to the caller."""
    ref = praat(x, sr, time_step)
    got = power_cepstrogram(x, sr, ARGS[0], time_step, ARGS[1], ARGS[2])
    assert got[0].shape == ref[0].shape
    n_frames = ref[0].shape[1]
    np.testing.assert_allclose(
        got[1] + got[2] * np.arange(n_frames), ref[1] + ref[2] * np.arange(n_frames), rtol=0, atol=1e-12
    )
    assert got[2] == ref[2]
    assert got[3] == pytest.approx(ref[3], abs=1e-15)
    assert got[4] == pytest.approx(ref[4], rel=1e-15)
    return ref[0], got[0], ref[1] + ref[2] * np.arange(n_frames)


def errors(ref, got):
    """Max difference relative to the matrix's max, and the largest over frames of the
    difference at quefrencies above 0 relative to that frame's max there (the
    0-quefrency row, the square of the mean log power, dwarfs the rest); frames that
    are 0 at all those quefrencies (digital silence) must be equal."""
    d = np.abs(got - ref)
    frame_max = np.abs(ref[1:]).max(axis=0)
    empty = frame_max == 0
    assert np.array_equal(got[:, empty], ref[:, empty])
    per_frame = (d[1:, ~empty] / frame_max[~empty]).max() if (~empty).any() else 0.0
    return d.max() / np.abs(ref).max(), per_frame


CASES = {
    "voice 16 kHz": (lambda: voice(16000, 1.0), 16000),
    "white noise 16 kHz": (lambda: white(16000, 1.0), 16000),
    "voice 10 kHz (no resampling)": (lambda: voice(10000, 0.6), 10000),
    "voice 22050 Hz": (lambda: voice(22050, 0.6, f0=210.0), 22050),
    "voice 24 kHz": (lambda: voice(24000, 0.6), 24000),
    "voice 44.1 kHz": (lambda: voice(44100, 0.6, f0=95.0), 44100),
    "noise 44.1 kHz": (lambda: white(44100, 0.4), 44100),
    "16004 samples (resampled length a tie)": (lambda: voice(16000, 16004 / 16000), 16000),
    "60 ms (window cut to the sound)": (lambda: voice(16000, 0.06), 16000),
    "37 ms at 22050 Hz": (lambda: voice(22050, 0.037), 22050),
    "3 ms (32-point FFT)": (lambda: white(16000, 0.003), 16000),
}


@pytest.mark.parametrize("time_step", [0.005, 0.002])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_praat(case, time_step):
    make, sr = CASES[case]
    ref, got, _ = compare(make(), sr, time_step)
    rel, per_frame = errors(ref, got)
    assert rel < TOL
    assert per_frame < TOL


@pytest.mark.parametrize("time_step", [0.005, 0.002])
def test_digital_silence_without_resampling(time_step):
    """At 10 kHz the sound is used as it is, so silent frames are exact zeros in both."""
    ref, got, _ = compare(with_silences(10000), 10000, time_step)
    assert (np.abs(ref[1:]).max(axis=0) == 0).sum() > 40  # frames wholly in a silence
    rel, per_frame = errors(ref, got)
    assert rel < TOL
    assert per_frame < TOL


@pytest.mark.parametrize("time_step", [0.005, 0.002])
def test_digital_silence_after_resampling(time_step):
    """At 16 kHz the FFT low-pass fills the silences with faint ringing near the cutoff;
    frames that see any of the sound agree to rounding. Frames wholly inside a silence
    hold almost nothing but that ringing, and their log spectra at other frequencies
    are rounding noise, so Praat itself moves there by about 1e-6 of the matrix's max
    when the input is scaled by 1 + 2^-40; there the two agree to that order only."""
    sr = 16000
    x = with_silences(sr)
    ref, got, times = compare(x, sr, time_step)
    t_sound = (np.flatnonzero(x) + 0.5) / sr
    sees_sound = np.array([np.any(np.abs(t_sound - t) < 0.05) for t in times])
    assert sees_sound.sum() > 0.6 * len(times) and (~sees_sound).sum() > 20
    big = np.abs(ref).max()
    diff = np.abs(got - ref).max(axis=0) / big
    assert diff[sees_sound].max() < TOL
    assert errors(ref[:, sees_sound], got[:, sees_sound])[1] < TOL
    assert diff[~sees_sound].max() < 1e-4
    self_diff = np.abs(praat(x * (1 + 2.0**-40), sr, time_step)[0] - ref).max(axis=0) / big
    assert self_diff[~sees_sound].max() > 1e-8
    assert self_diff[sees_sound].max() < TOL


@pytest.mark.parametrize("sr", [8000, 5000])
def test_upsampled_rates(sr):
    """Below 10 kHz (sinc upsampling at 8 kHz, Praat's FFT doubling at 5 kHz) the band
    above the old Nyquist frequency holds only the window's leakage, whose logarithm
    rounding moves by more (here about 1e-11 at 8 kHz, 2e-7 at 5 kHz of the matrix's max);
    the matrices still agree closely."""
    ref, got, _ = compare(voice(sr, 0.6), sr, 0.005)
    rel, per_frame = errors(ref, got)
    assert rel < 1e-6
    assert per_frame < 1e-5


@pytest.mark.parametrize(
    "make,sr",
    [
        (lambda: voice(16000, 1.3), 16000),
        (lambda: voice(16000, 1.0, f0=220.0, noise=0.05, seed=4), 16000),
        (lambda: voice(22050, 0.8, f0=95.0, noise=0.01), 22050),
        (lambda: with_silences(10000), 10000),
    ],
)
def test_cpps_on_our_cepstrogram_equals_praats_get_cpps(make, sr):
    x = make()
    st = CPPSSettings()
    ours = cepstrogram_cpps(
        *power_cepstrogram(x, sr, st.pitch_floor, st.time_step, st.max_frequency, st.pre_emphasis_from), st
    )
    assert ours == pytest.approx(praat_cpps_db(parselmouth.Sound(x, sampling_frequency=sr), st), abs=1e-9)


@pytest.mark.parametrize("up,down", [(10, 16), (5, 8), (16, 10), (2, 3), (6, 6)])
def test_polyphase_filter_adds_as_scipys_upfirdn(up, down):
    """The compiled polyphase filter gives scipy.signal.upfirdn's sums bit for bit: the
    same products, added in the same order."""
    from scipy.signal import upfirdn

    from voicebias.instruments.cepstrum import _fine_kernel, _polyphase

    y = np.random.default_rng(up * down).standard_normal(5000)
    kern = _fine_kernel(up)
    slope = (_fine_kernel(up, 1e-5) - _fine_kernel(up, -1e-5)) / 2e-5  # as the resampling uses them
    assert np.isfinite(kern).all() and np.isfinite(slope).all()
    lead, count = 60 * up, 1200
    value, deriv = _polyphase(y, kern, slope, up, down, lead, count)
    for got, k in ((value, kern), (deriv, slope)):
        c = k.size // 2
        delay = (-(lead + c)) % down
        m0 = (lead + c + delay) // down
        want = upfirdn(np.concatenate([np.zeros(delay), k]), y, up, down)[m0 : m0 + count]
        assert got.tobytes() == want.tobytes()
