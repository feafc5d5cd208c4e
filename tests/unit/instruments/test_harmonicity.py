"""The cross-correlation HNR against Praat's own "To Harmonicity (cc)", frame by frame,
on voices from clean to noise-like, at both pitch floors the params use, on sounds with
digital silence and on sounds too short for a whole analysis."""

import numpy as np
import parselmouth
import pytest

from voicebias.instruments.harmonicity import harmonicity_at, interpolation_weights, praat_harmonicity

SR = 16000


def voice(f0, dur, noise, seed, sr=SR):
    t = np.arange(int(dur * sr)) / sr
    rng = np.random.default_rng(seed)
    contour = f0 * (1 + 0.04 * np.sin(2 * np.pi * 4 * t) + 0.01 * np.cumsum(rng.standard_normal(len(t))) / np.sqrt(sr))
    phase = 2 * np.pi * np.cumsum(contour) / sr
    y = sum(np.sin(k * phase) / k**1.2 for k in range(1, int(0.45 * sr / f0)))
    envelope = np.clip(np.sin(np.pi * t / dur) * 3, 0, 1)
    return envelope * y + noise * rng.standard_normal(len(t))


def praat_frames(snd, times, time_step, floor):
    harm = praat_harmonicity(snd, time_step, floor)
    idx = np.clip(np.round((times - harm.x1) / harm.dx).astype(int), 0, harm.nx - 1)
    return harm.values[0][idx]


def every_frame(snd, time_step):
    return np.arange(0.0, snd.duration, time_step / 2)


@pytest.mark.parametrize("floor", [60.0, 100.0])
@pytest.mark.parametrize("f0,noise", [(90.0, 0.0), (120.0, 0.02), (210.0, 0.3), (300.0, 2.0), (150.0, 20.0)])
def test_every_frame_equals_praat(f0, noise, floor):
    snd = parselmouth.Sound(voice(f0, 1.2, noise, seed=int(f0 + noise)), sampling_frequency=SR)
    times = every_frame(snd, 0.01)
    got = harmonicity_at(snd, times, 0.01, floor)
    ref = praat_frames(snd, times, 0.01, floor)
    assert (got == -200).sum() == (ref == -200).sum()
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-7)


@pytest.mark.parametrize("seed", [0, 2])
def test_bursts_after_digital_silence_equal_praat(seed):
    """Voiced bursts (alternating polarity) between stretches of exact zeros: at a burst's
    onset the correlated stretch is constant after the local mean is removed, so the
    correlation is 1 at every small lag and holds no maximum there, in Praat as here.
    Also with a DC offset added."""
    rng = np.random.default_rng(seed)
    parts = []
    for k in range(8):
        parts += [
            np.zeros(int(rng.integers(300, 2000))),
            voice(float(rng.uniform(90, 250)), 0.2, 0.05, seed=k) * (1 - 2 * (k % 2)),
        ]
    x = np.concatenate(parts)
    for y in (x, x + 0.25):
        snd = parselmouth.Sound(y, sampling_frequency=SR)
        times = every_frame(snd, 0.01)
        np.testing.assert_allclose(
            harmonicity_at(snd, times, 0.01, 60.0), praat_frames(snd, times, 0.01, 60.0), rtol=0, atol=1e-7
        )


@pytest.mark.parametrize("sr", [11025, 22050, 24000])
def test_other_sample_rates_equal_praat(sr):
    snd = parselmouth.Sound(voice(180.0, 0.8, 0.05, seed=sr, sr=sr), sampling_frequency=sr)
    times = every_frame(snd, 0.005)
    np.testing.assert_allclose(
        harmonicity_at(snd, times, 0.005, 75.0), praat_frames(snd, times, 0.005, 75.0), rtol=0, atol=1e-7
    )


def test_sounds_too_short_for_a_frame_behave_as_praat():
    short = parselmouth.Sound(voice(200.0, 0.03, 0.0, seed=1), sampling_frequency=SR)
    with pytest.raises(parselmouth.PraatError):
        praat_harmonicity(short, 0.01, 60.0)
    with pytest.raises(parselmouth.PraatError):
        harmonicity_at(short, np.array([0.015]), 0.01, 60.0)
    one = parselmouth.Sound(voice(200.0, 0.04, 0.0, seed=1), sampling_frequency=SR)
    times = np.array([0.0, 0.02, 0.04])
    np.testing.assert_allclose(
        harmonicity_at(one, times, 0.01, 60.0), praat_frames(one, times, 0.01, 60.0), rtol=0, atol=1e-9
    )


def test_interpolation_weights_reproduce_polynomials_and_samples():
    """The interpolation passes through the samples' neighbourhood exactly for a linear
    ramp at the array's edges (linear and cubic cases), and its sinc weights sum to
    about one in the interior."""
    n = 41
    y = 3.0 + 0.5 * np.arange(1, n + 1)
    for x in (1.3, 40.6, 2.25, 39.5):  # depth 1 at both ends, depth 2 one point in
        left, w = interpolation_weights(n, np.array([x]))
        assert float(y[left - 1 : left - 1 + w.shape[1]] @ w[0]) == pytest.approx(3.0 + 0.5 * x, abs=1e-12)
    left, w = interpolation_weights(n, np.array([20.5]))
    assert w.shape[1] == 2 * 20 and float(w.sum()) == pytest.approx(1.0, abs=0.05)
    with pytest.raises(ValueError, match="outside"):
        interpolation_weights(n, np.array([0.5]))
