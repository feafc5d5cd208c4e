"""Acoustic measures of a voice (Praat through parselmouth 0.4.7 / Praat 6.1.38).

One row per file, in one tidy table. Every frame-wise measure is a median over
voiced frames (Praat's pitch track), so pauses and unvoiced consonants do not pull
it. Units:

- duration_s (s); voiced_fraction (share of pitch frames that are voiced);
- f0_median_hz (Hz) and f0_median_st (semitones re 100 Hz);
- f1_hz, f2_hz, f3_hz (Hz; by default a discrete all-pole model of the harmonics
  below the formant ceiling, El-Jaroudi & Makhoul, 1991, fitted per voiced frame:
  it holds F1 at high F0, where Praat's Burg analysis is pulled toward a harmonic;
  `formant_method: burg` restores Burg. Accuracy on synthetic vowels: docs/formants.md);
- formant_index (octaves relative to adult-male vowel norms: Peterson & Barney,
  1952, mean F1/F2/F3 over ten American English vowels = 502/1420/2386 Hz), taken
  per voiced frame and summarised by its median;
- h1_h2_db, h1_a3_db and their Iseli-corrected versions (dB), cpps_db (dB),
  hnr_db (dB): see voicebias.instruments.voice_quality for the method.

Settings per voice gender come from the `acoustics` section of params.yaml:
`pitch_range` (floor, ceiling Hz), `max_formant` (Hz), `time_step` (s),
`formant_method` ('dap' or 'burg'); gender-neutral settings for voices that may follow
their input (MeasureSettings.neutral) from `neutral_pitch_range` (Hz),
`neutral_max_formant` (Hz) and `octave_check_st` (semitones); optional
`bandwidths` for the Iseli correction ('hawks_miller', default, or 'measured'),
`cpps_time_step` (s, default 0.002 as in Praat; 0.005 reads within about 0.05 dB
of it at under a third of the time, 0.01 within about 0.15 dB), and audio checks:
`max_duration_s`, `max_clipped_fraction`, `silence_dbfs`.

Files that cannot be measured are kept in the table with status 'excluded', a
short `reason` code and the readable `error` (voicebias.audio lists the codes);
conversions applied to accepted files (stereo to mono, resampling) are in `note`.
Two codes come from the measuring itself:

- `too_short`: a signal too short for the pitch analysis to give the MIN_VOICED_FRAMES
  (3) frames every measure is taken over. Praat's autocorrelation pitch analysis uses a
  window of PITCH_WINDOW_PERIODS (3) periods of the pitch floor, and its frames are
  `time_step` apart, so the minimum is 3 / pitch_floor + 2 * time_step (min_duration_s):
  70 ms at a 60 Hz floor, 50 ms at 100 Hz, with time_step 0.01 s. The other analyses
  (formants, harmonic levels, CPPS, HNR) are taken at the pitch frames and need no more.
  Shorter audio is refused before Praat sees it, which would otherwise stop with an
  error below the window and find fewer than three frames above it.
- `measure_error`: any other error raised while one file is read or measured; its
  text is in `error`. It is that file's row: the other files are measured as if alone.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import parselmouth
from parselmouth.praat import call

from voicebias.audio import (
    MIN_VOICED_FRAMES,
    PITCH_WINDOW_PERIODS,
    AudioChecks,
    AudioError,
    load_for_analysis,
    min_analysable_s,
)
from voicebias.contract import MEASURE_COLUMNS
from voicebias.errors import ConfigError, NotFound
from voicebias.instruments.jit import kernel
from voicebias.instruments.units import hz_to_semitones
from voicebias.instruments.voice_quality import (
    FFT_CHUNK,
    CPPSSettings,
    _windowed_frames,
    cpps_db,
    harmonic_levels,
    hnr_db,
    voiced_intervals,
)

# Peterson & Barney (1952), Table II, adult men, averaged over the ten vowels (Hz).
MALE_FORMANT_NORMS = (502.0, 1420.0, 2386.0)

STATUS_COLUMNS = ["status", "reason", "error", "note"]


def _validated(params: dict[str, Any]) -> dict[str, Any]:
    """The `acoustics` section checked against the schema, defaults filled in."""
    from voicebias.params import Acoustics, validate_section

    return validate_section(Acoustics, params, "acoustics")


def _schema_default(field: str) -> Any:
    """The default params.yaml's schema gives `acoustics.<field>` (stated there once)."""
    from voicebias.params import Acoustics

    return Acoustics.model_fields[field].default


@dataclass(frozen=True)
class MeasureSettings:
    """Analysis settings for one voice gender (pitch range and formant ceiling in Hz,
    time step in s) and the checks applied to each file. The defaults are the schema's
    (voicebias.params.Acoustics); the pitch range and ceiling default to its gender-neutral ones."""

    pitch_floor: float = _schema_default("neutral_pitch_range")[0]
    pitch_ceiling: float = _schema_default("neutral_pitch_range")[1]
    max_formant: float = _schema_default("neutral_max_formant")
    time_step: float = _schema_default("time_step")
    max_duration_s: float = _schema_default("max_duration_s")
    max_clipped_fraction: float = _schema_default("max_clipped_fraction")
    silence_dbfs: float = _schema_default("silence_dbfs")
    bandwidths: str = _schema_default("bandwidths")
    cpps_time_step: float = _schema_default("cpps_time_step")
    # H1-H2, H1-A3, CPPS and HNR cost most of the analysis; scoring that needs only
    # F0, formants and classifier margins (RQ1 output deltas) can switch them off.
    voice_quality: bool = True
    # 'dap' (discrete all-pole on the harmonics) or 'burg' (Praat's Burg, five formants).
    formant_method: str = _schema_default("formant_method")
    # > 0: fold pitch frames an octave off the track's median back (tolerance, semitones).
    octave_check_st: float = 0.0

    @classmethod
    def for_gender(cls, params: dict[str, Any], gender: str) -> "MeasureSettings":
        """The settings of `gender` from the `acoustics` section (validated here, so its defaults are
        the schema's)."""
        a = _validated(params)
        if gender not in a["pitch_range"] or gender not in a["max_formant"]:
            raise NotFound(
                f"acoustics settings have no entry for voice gender '{gender}' "
                f"(pitch_range: {sorted(a['pitch_range'])}, max_formant: {sorted(a['max_formant'])})"
            )
        floor, ceiling = a["pitch_range"][gender]
        return cls._from(a, float(floor), float(ceiling), float(a["max_formant"][gender]))

    @classmethod
    def neutral(cls, params: dict[str, Any]) -> "MeasureSettings":
        """Settings that do not depend on a voice gender, for voices that may follow
        their input: `neutral_pitch_range` (Hz) with the octave check `octave_check_st`
        (semitones) and `neutral_max_formant` (Hz), defaults from the schema."""
        a = _validated(params)
        floor, ceiling = a["neutral_pitch_range"]
        return replace(
            cls._from(a, float(floor), float(ceiling), float(a["neutral_max_formant"])),
            octave_check_st=float(a["octave_check_st"]),
        )

    @classmethod
    def _from(cls, a: dict[str, Any], floor: float, ceiling: float, max_formant: float) -> "MeasureSettings":
        return cls(
            pitch_floor=floor,
            pitch_ceiling=ceiling,
            max_formant=max_formant,
            time_step=float(a["time_step"]),
            max_duration_s=float(a["max_duration_s"]),
            max_clipped_fraction=float(a["max_clipped_fraction"]),
            silence_dbfs=float(a["silence_dbfs"]),
            bandwidths=str(a["bandwidths"]),
            cpps_time_step=float(a["cpps_time_step"]),
            formant_method=str(a["formant_method"]),
        )

    def checks(self) -> AudioChecks:
        # The signal must carry content up to the formant ceiling: Nyquist >= max_formant.
        return AudioChecks(
            min_sample_rate=int(np.ceil(2 * self.max_formant)),
            max_duration_s=self.max_duration_s,
            max_clipped_fraction=self.max_clipped_fraction,
            silence_dbfs=self.silence_dbfs,
        )


# Discrete all-pole analysis: model order (five formants plus one pole pair for the
# glottal source), and the poles kept as formants: above the source region and no
# wider than a vowel formant.
DAP_ORDER = 12
DAP_MIN_FORMANT_HZ = 150.0
DAP_MAX_BANDWIDTH_HZ = 700.0
DAP_ITERATIONS = 20
DAP_FRAMES_PER_CHUNK = 256
# Sweeps of the root finder from a neighbouring frame's roots before it starts afresh.
ROOT_ITERATIONS = 50


def harmonic_window_s(
    f0: np.ndarray, n_periods: float = 4.0, min_window_s: float = 0.025, max_window_s: float = 0.05
) -> float:
    """Analysis window (s) for the harmonic spectra of a file: `n_periods` periods of its
    median f0 (Hz), clipped to `min_window_s`..`max_window_s`."""
    return float(np.clip(n_periods / np.median(f0), min_window_s, max_window_s))


def harmonic_power(
    x: np.ndarray, sr: int, times: np.ndarray, f0: np.ndarray, ceiling: float, window_s: float | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frequency (Hz) and power (linear, arbitrary common reference) of every harmonic
    k f0 below `ceiling` Hz, per frame.

    times (s) and f0 (Hz) are the voiced frames. A Hann window of `window_s` s
    (default: harmonic_window_s of these frames), zero-padded to four times its length;
    each harmonic is the spectral peak within k f0 +- 0.2 f0, refined by parabolic
    interpolation of the log power. Returns freqs, power and a mask, each of shape
    (frames, harmonics); the mask is False past the ceiling.

    The frames are windowed and transformed a few at a time (FFT_CHUNK values), so the
    spectra stay in the processor's cache, and the peaks are searched at the bins each
    harmonic's range holds (`_harmonic_peaks`).
    """
    x = np.asarray(x, dtype=np.float64)
    f0 = np.asarray(f0, dtype=float)
    n = int(round((window_s or harmonic_window_s(f0)) * sr)) | 1
    starts = np.round(np.asarray(times, dtype=float) * sr).astype(np.int64) - n // 2
    nfft = 1 << int(np.ceil(np.log2(4 * n)))
    df = sr / nfft
    harmonics = f0[:, None] * np.arange(1, int(ceiling // f0.min()) + 1)[None, :]
    mask = harmonics < ceiling
    reach = np.maximum(1, np.floor(0.2 * f0 / df)).astype(np.int64)
    centre = np.round(harmonics / df).astype(np.int64)
    window = np.hanning(n)[None, :]
    freqs, power = np.empty(harmonics.shape), np.empty(harmonics.shape)
    step = max(1, FFT_CHUNK // nfft)
    frames = np.zeros((min(step, len(f0)), nfft))
    spectra = np.empty((len(frames), nfft // 2 + 1), dtype=complex)
    which, lengths = np.zeros(len(frames), dtype=np.int64), np.array([n])
    for lo in range(0, len(f0), step):
        part = slice(lo, lo + step)
        k = len(centre[part])
        _windowed_frames(x, starts[part], window, which[:k], lengths, frames)
        spec = np.fft.rfft(frames[:k], axis=1, out=spectra[:k])
        _harmonic_peaks(spec, centre[part], reach[part], df, freqs[part], power[part])
    return freqs, power, mask


@kernel
def _harmonic_peaks(spec, centre, reach, df, freqs, power):  # pragma: no cover - compiled
    """Per frame and harmonic: the bin of the highest power |spec|^2 among the bins
    centre +- reach (each clipped to 1 .. bins - 2; the first of equal maxima), refined
    by a parabola through the log power at it and its neighbours (the shift clipped to
    +- half a bin): frequency (peak + shift) df into `freqs`, power into `power`."""
    n_bins = spec.shape[1]
    for t in range(centre.shape[0]):
        r = reach[t]
        for h in range(centre.shape[1]):
            best, at = -1.0, 0
            for off in range(-r, r + 1):
                b = min(max(centre[t, h] + off, 1), n_bins - 2)
                v = spec[t, b].real * spec[t, b].real + spec[t, b].imag * spec[t, b].imag
                if v > best or at == 0:
                    best, at = v, b
            lo, hi = spec[t, at - 1], spec[t, at + 1]
            a = math.log(lo.real * lo.real + lo.imag * lo.imag + 1e-300)
            m = math.log(best + 1e-300)
            c = math.log(hi.real * hi.real + hi.imag * hi.imag + 1e-300)
            denom = a - 2 * m + c
            shift = 0.5 * (a - c) / denom if denom < 0 else 0.0
            shift = min(max(shift, -0.5), 0.5)
            freqs[t, h] = (at + shift) * df
            power[t, h] = math.exp(m - 0.25 * (a - c) * shift)


def discrete_all_pole(
    freqs: np.ndarray,
    power: np.ndarray,
    mask: np.ndarray,
    ceiling: float,
    sr: int,
    order: int = DAP_ORDER,
    iterations: int = DAP_ITERATIONS,
    pre_emphasis_hz: float = 50.0,
) -> np.ndarray:
    """All-pole model fitted to a line spectrum, per frame (El-Jaroudi & Makhoul, 1991).

    freqs (Hz), power and mask as returned by `harmonic_power` (the mask of each frame
    a run of harmonics from the first). The band 0..`ceiling` Hz is the model's full
    band (as Praat does by resampling to twice the ceiling), with Praat's pre-emphasis
    from `pre_emphasis_hz`. The model minimises the Itakura-Saito distance to the
    harmonic powers alone, so the spectrum between harmonics, which a voiced sound does
    not define, plays no part; linear prediction on the autocorrelation of a
    high-pitched voice instead fits the aliased autocorrelation of the harmonics and
    pulls formants toward them. Starts from linear prediction on the harmonics and
    iterates the paper's fixed-point equations (damped by one half) on all frames
    together until no coefficient of any frame moves by 1e-7 or `iterations` are done.
    Returns the predictor polynomials, shape (frames, order + 1), first coefficient 1;
    NaN for a frame whose normal equations are not positive definite.
    """
    count = np.asarray(mask, dtype=bool).sum(axis=1)
    if np.any(np.asarray(mask)[np.arange(mask.shape[1])[None, :] >= count[:, None]]):
        raise ValueError("each frame's mask must be a run of harmonics from the first")
    alpha = math.exp(-2 * math.pi * pre_emphasis_hz / sr)
    freqs = np.asarray(freqs, dtype=np.float64)
    th, w = 2 * np.pi * freqs / sr, np.pi * freqs / ceiling
    return _dap_fit(
        np.ascontiguousarray(power, dtype=np.float64),
        np.cos(th),
        np.sin(th),
        np.cos(w),
        np.sin(w),
        count.astype(np.int64),
        int(order),
        int(iterations),
        alpha,
    )


@kernel
def _dap_fit(power, cos_th, sin_th, cos_w, sin_w, count, order, iterations, alpha):  # pragma: no cover - compiled
    """The fit of `discrete_all_pole`, given the cosines and sines of each harmonic's
    angle th = 2 pi f / sr (for the pre-emphasis) and w = pi f / ceiling. Per frame:
    the pre-emphasised powers p_i of its count harmonics, normalised to mean 1; the
    autocorrelation r_k = mean_i p_i cos(k w_i) (r_0 raised by 1e-9), the Cholesky
    factor of its Toeplitz matrix R, and the linear-prediction start
    a = (1, -R^-1 r_1..p). Each iteration evaluates A(e^-jw) = sum_k a_k e^-jkw at the
    harmonics, the gain g = mean_i p_i |A_i|^2 and the model's autocorrelation
    m_k = mean_i Re(A_i e^jkw_i) / |A_i|^2 = sum_l a_l rq_|k-l|, rq_d = mean_i
    cos(d w_i) / |A_i|^2, and steps to (1, R^-1 (g m - r)_1..p).

    The frames stop together, after the first iteration at which no coefficient of any
    frame moved by 1e-7: each frame runs every iteration on its own (its tables stay in
    the processor's cache), keeping its coefficients after each, and the iteration at
    which they all stood still picks the result."""
    n_frames, n_harm = power.shape
    m = order + 1
    history = np.full((n_frames, iterations + 1, m), np.nan)
    moved = np.full((n_frames, iterations), np.nan)
    cos, sin = np.empty((n_harm, m)), np.empty((n_harm, m))  # harmonic-major
    cos_t, sin_t = np.empty((m, n_harm)), np.empty((m, n_harm))  # lag-major
    p, re, im, q = np.empty(n_harm), np.empty(n_harm), np.empty(n_harm), np.empty(n_harm)
    r, rq, a, step = np.empty(m), np.empty(m), np.empty(m), np.empty(m)
    chol, inverse = np.empty((order, order)), np.empty((order, order))
    rhs = np.empty(order)
    for t in range(n_frames):
        h_n = count[t]
        weight = 1.0 / h_n
        total = 0.0
        for i in range(h_n):
            e_re, e_im = 1.0 - alpha * cos_th[t, i], alpha * sin_th[t, i]
            p[i] = power[t, i] * (e_re * e_re + e_im * e_im)
            total += p[i] * weight
        r[:] = 0.0
        for i in range(h_n):
            p[i] /= total
            c1, s1 = cos_w[t, i], sin_w[t, i]
            cos[i, 0], sin[i, 0] = 1.0, 0.0
            cos[i, 1], sin[i, 1] = c1, s1
            for k in range(2, m):
                cos[i, k] = cos[i, k - 1] * c1 - sin[i, k - 1] * s1
                sin[i, k] = sin[i, k - 1] * c1 + cos[i, k - 1] * s1
            for k in range(m):
                cos_t[k, i], sin_t[k, i] = cos[i, k], sin[i, k]
                r[k] += cos[i, k] * (p[i] * weight)
        r[0] *= 1 + 1e-9
        if not _cholesky_toeplitz(r, chol):
            continue
        _cholesky_inverse(chol, inverse)  # the same matrix at every iteration
        for k in range(order):
            rhs[k] = -r[k + 1]
        a[0] = 1.0
        _matvec(inverse, rhs, a[1:])
        history[t, 0] = a
        for it in range(iterations):
            re[:h_n] = 0.0
            im[:h_n] = 0.0
            for k in range(m):
                ak = a[k]
                for i in range(h_n):
                    re[i] += cos_t[k, i] * ak
                    im[i] -= sin_t[k, i] * ak
            gain = 0.0
            for i in range(h_n):
                mag = re[i] * re[i] + im[i] * im[i]
                gain += p[i] * mag * weight
                q[i] = weight / mag
            # the model's autocorrelation m_k = sum_l a_l rq_|k-l|, rq_d = mean_i cos(d w_i) / |A_i|^2
            rq[:] = 0.0
            for i in range(h_n):
                for k in range(m):
                    rq[k] += q[i] * cos[i, k]
            for k in range(order):
                model = 0.0
                for lag in range(m):
                    model += a[lag] * rq[abs(k + 1 - lag)]
                rhs[k] = gain * model - r[k + 1]
            step[0] = 1.0
            _matvec(inverse, rhs, step[1:])
            d = 0.0
            for k in range(m):
                e = abs(step[k] - a[k])
                if e > d or e != e:
                    d = e
            moved[t, it] = d
            for k in range(m):
                a[k] = 0.5 * (a[k] + step[k])
            history[t, it + 1] = a
    done = iterations
    for it in range(iterations):
        still = True
        for t in range(n_frames):
            if not moved[t, it] < 1e-7:  # NaN (an undefined frame) never counts as still
                still = False
                break
        if still:
            done = it + 1
            break
    return history[:, done].copy()


@kernel
def _cholesky_toeplitz(r, low):  # pragma: no cover - compiled
    """Lower Cholesky factor of the symmetric Toeplitz matrix R[i, j] = r[|i - j|] of
    size len(low) into `low`; False where R is not (numerically) positive definite."""
    n = low.shape[0]
    for j in range(n):
        d = r[0]
        for k in range(j):
            d -= low[j, k] * low[j, k]
        if not d > 0.0:
            return False
        low[j, j] = math.sqrt(d)
        for i in range(j + 1, n):
            v = r[i - j]
            for k in range(j):
                v -= low[i, k] * low[j, k]
            low[i, j] = v / low[j, j]
    return True


@kernel
def _cholesky_inverse(low, inverse):  # pragma: no cover - compiled
    """(L L^T)^-1 into `inverse`, for L lower triangular: L^-1 by forward and then
    L^-T L^-1 by back substitution, a row of the identity's columns at a time."""
    n = low.shape[0]
    inverse[:] = 0.0
    for i in range(n):
        inverse[i, i] = 1.0
        for k in range(i):
            for j in range(n):
                inverse[i, j] -= low[i, k] * inverse[k, j]
        for j in range(n):
            inverse[i, j] /= low[i, i]
    for i in range(n - 1, -1, -1):
        for k in range(i + 1, n):
            for j in range(n):
                inverse[i, j] -= low[k, i] * inverse[k, j]
        for j in range(n):
            inverse[i, j] /= low[i, i]


@kernel
def _matvec(matrix, v, out):  # pragma: no cover - compiled
    """out = matrix @ v, each element summed in order of the columns."""
    for i in range(matrix.shape[0]):
        acc = 0.0
        for k in range(matrix.shape[1]):
            acc += matrix[i, k] * v[k]
        out[i] = acc


def poles_to_formants(a: np.ndarray, ceiling: float, n: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """The lowest `n` formant frequencies and bandwidths (Hz) of predictor polynomials
    (frames, order + 1) on the band 0..`ceiling` Hz.

    Poles above DAP_MIN_FORMANT_HZ and narrower than DAP_MAX_BANDWIDTH_HZ come first;
    where fewer than `n` qualify (a spectrum without formant peaks), the other poles
    of the band fill in, lowest first, as Praat's Burg analysis reports them. NaN
    where the band holds fewer than `n` poles. The poles are the polynomials' roots
    (polynomial_roots)."""
    roots = polynomial_roots(np.asarray(a, dtype=np.float64))
    freq, bw = _pole_frequencies(roots, float(ceiling))
    in_band = (roots.imag > 0) & (freq > 50.0) & (freq < ceiling - 50.0)
    formant_like = in_band & (freq > DAP_MIN_FORMANT_HZ) & (bw < DAP_MAX_BANDWIDTH_HZ)
    rank = np.where(formant_like, freq, np.where(in_band, freq + 2 * ceiling, np.inf))
    chosen = np.argsort(rank, axis=1)[:, :n]
    freq = np.where(np.isfinite(np.take_along_axis(rank, chosen, 1)), np.take_along_axis(freq, chosen, 1), np.nan)
    bw = np.where(np.isfinite(freq), np.take_along_axis(bw, chosen, 1), np.nan)
    by_freq = np.argsort(np.where(np.isfinite(freq), freq, np.inf), axis=1)
    return np.take_along_axis(freq, by_freq, 1), np.take_along_axis(bw, by_freq, 1)


def polynomial_roots(a: np.ndarray, max_iter: int = ROOT_ITERATIONS) -> np.ndarray:
    """The roots of the monic polynomials z^n + a[t, 1] z^(n-1) + ... + a[t, n], one row
    per frame t (a[t, 0] is taken as 1): shape (frames, n), complex; NaN for a row
    with a coefficient that is not finite.

    Aberth-Ehrlich iteration (Aberth, 1973, Math. Comp. 27: 339-344), root by root in
    turn: a root whose residual |p(z)| is within four units of rounding of the sum
    sum_k |a_k| |z|^(n-k) is done. Each frame starts from the previous frame's roots
    (neighbouring frames have neighbouring polynomials); the first frame, and a frame
    that does not settle within `max_iter` sweeps from there, starts from n points on a
    circle whose radius is the roots' geometric mean (4 max_iter sweeps; roots still
    moving after those are returned as they stand)."""
    a = np.ascontiguousarray(a, dtype=np.float64)
    return _aberth_roots(a, int(max_iter))


@kernel
def _aberth_sweeps(a, z, done, max_iter):  # pragma: no cover - compiled
    """Aberth-Ehrlich sweeps on the roots z of the monic polynomial with coefficients a
    (a[0] = 1) until every root is done (see polynomial_roots); True if they all are."""
    n = z.shape[0]
    eps = 2.0**-52
    for i in range(n):
        done[i] = False
    for _ in range(max_iter):
        moved = False
        for i in range(n):
            if done[i]:
                continue
            zi = z[i]
            p, dp = complex(1.0, 0.0), complex(0.0, 0.0)
            bound, radius = 1.0, abs(zi)
            for k in range(1, n + 1):
                dp = dp * zi + p
                p = p * zi + a[k]
                bound = bound * radius + abs(a[k])
            if abs(p) <= 4.0 * eps * bound:
                done[i] = True
                continue
            sigma = complex(0.0, 0.0)
            for j in range(n):
                if j != i:
                    sigma += 1.0 / (zi - z[j])
            ratio = p / dp
            z[i] = zi - ratio / (1.0 - ratio * sigma)
            moved = True
        if not moved:
            return True
    for i in range(n):
        if not done[i]:
            return False
    return True


@kernel
def _aberth_roots(a, max_iter):  # pragma: no cover - compiled
    """polynomial_roots for every row of a."""
    n_frames, n = a.shape[0], a.shape[1] - 1
    out = np.full((n_frames, n), complex(np.nan, np.nan))
    z = np.empty(n, dtype=np.complex128)
    done = np.empty(n, dtype=np.bool_)
    warm = False
    for t in range(n_frames):
        finite = True
        for k in range(n + 1):
            if not math.isfinite(a[t, k]):
                finite = False
        if not finite:
            warm = False
            continue
        if not (warm and _aberth_sweeps(a[t], z, done, max_iter)):
            radius = abs(a[t, n]) ** (1.0 / n) if a[t, n] != 0.0 else 1.0
            for k in range(n):
                angle = 2.0 * math.pi * (k + 0.25) / n
                z[k] = complex(radius * math.cos(angle), radius * math.sin(angle))
            _aberth_sweeps(a[t], z, done, 4 * max_iter)
        out[t] = z
        warm = True
    return out


@kernel
def _pole_frequencies(roots, ceiling):  # pragma: no cover - compiled
    """Frequency (Hz, angle / pi * ceiling) and bandwidth (Hz, -log|z| / pi * 2 ceiling)
    of each root on the band 0..ceiling Hz."""
    freq = np.empty(roots.shape)
    bw = np.empty(roots.shape)
    for t in range(roots.shape[0]):
        for i in range(roots.shape[1]):
            z = roots[t, i]
            freq[t, i] = math.atan2(z.imag, z.real) / math.pi * ceiling
            bw[t, i] = -math.log(max(abs(z), 1e-300)) / math.pi * 2 * ceiling
    return freq, bw


def dap_formants(
    x: np.ndarray, sr: int, times: np.ndarray, f0: np.ndarray, ceiling: float
) -> tuple[np.ndarray, np.ndarray]:
    """F1-F3 and B1-B3 (Hz) at voiced frames (times in s, f0 in Hz) by discrete all-pole
    modelling of the harmonics below `ceiling` Hz. Returns two (frames, 3) arrays, NaN
    where a frame yields fewer than three formants."""
    f0 = np.asarray(f0, dtype=float)
    times = np.asarray(times, dtype=float)
    x = np.asarray(x, dtype=np.float64)
    window_s = harmonic_window_s(f0)
    tracks, bandwidths = np.full((len(f0), 3), np.nan), np.full((len(f0), 3), np.nan)
    for i in range(0, len(f0), DAP_FRAMES_PER_CHUNK):
        part = slice(i, i + DAP_FRAMES_PER_CHUNK)
        freqs, power, mask = harmonic_power(x, sr, times[part], f0[part], ceiling, window_s)
        # A floor 120 dB under each frame's strongest harmonic keeps the fit finite where
        # a frame holds digital silence between harmonics.
        loudest = np.max(np.where(mask, power, 0.0), axis=1)
        power = np.maximum(power, 1e-12 * loudest[:, None])
        usable = (mask.sum(axis=1) > DAP_ORDER // 2) & (loudest > 0)
        if not usable.any():
            continue
        with np.errstate(all="ignore"):
            a = discrete_all_pole(freqs[usable], power[usable], mask[usable], ceiling, sr)
        fitted = np.isfinite(a).all(axis=1)
        rows = np.flatnonzero(usable)[fitted] + i
        if rows.size:
            tracks[rows], bandwidths[rows] = poles_to_formants(a[fitted], ceiling)
    return tracks, bandwidths


def correct_octave_jumps(f0: np.ndarray, tolerance_st: float) -> tuple[np.ndarray, int]:
    """Fold pitch frames that sit one octave above or below the track's median (within
    `tolerance_st` semitones of +-12 st) back to the median's octave.

    f0 (Hz) of voiced frames. Returns the corrected f0 (Hz) and the number of frames
    moved. Halving and doubling are the errors a wide pitch range invites; a real
    octave jump of the voice is rare outside creak, which such a range is not used for.
    """
    f0 = np.asarray(f0, dtype=float).copy()
    st = 12.0 * np.log2(f0 / np.median(f0))
    up, down = np.abs(st - 12.0) < tolerance_st, np.abs(st + 12.0) < tolerance_st
    f0[up] /= 2.0
    f0[down] *= 2.0
    return f0, int(up.sum() + down.sum())


def formant_index(f1, f2, f3) -> np.ndarray:
    """Mean log2 ratio of F1-F3 to adult-male norms (octaves; 0 = male norm), per frame."""
    return np.mean(np.log2(np.stack([f1, f2, f3], axis=-1) / np.array(MALE_FORMANT_NORMS)), axis=-1)


#: the parts of the measure set, in the order a file is measured. Each is a unit of the
#: measurement cache (voicebias.instruments.measure_cache): its own settings, its own code.
COMPONENTS = ("pitch", "formants", "harmonics", "cpps", "hnr")
#: the measures (MEASURE_COLUMNS) each component gives; duration_s comes with every read
COMPONENT_MEASURES = {
    "pitch": ("voiced_fraction", "f0_median_hz", "f0_median_st"),
    "formants": ("f1_hz", "f2_hz", "f3_hz", "formant_index"),
    "harmonics": ("h1_h2_db", "h1_h2_corrected_db", "h1_a3_db", "h1_a3_corrected_db"),
    "cpps": ("cpps_db",),
    "hnr": ("hnr_db",),
}
#: the MeasureSettings fields each component reads itself (it also depends on those of the
#: components it builds on: COMPONENT_INPUTS)
COMPONENT_SETTINGS = {
    "pitch": ("pitch_floor", "pitch_ceiling", "time_step", "octave_check_st"),
    "formants": ("max_formant", "formant_method"),
    "harmonics": ("bandwidths",),
    "cpps": ("cpps_time_step",),
    "hnr": (),
}
COMPONENT_INPUTS = {
    "pitch": (),
    "formants": ("pitch",),
    "harmonics": ("pitch", "formants"),
    "cpps": ("pitch",),
    "hnr": ("pitch",),
}


def component_sources() -> dict[str, list[Any]]:
    """The functions and constants whose source decides each component (and the reader),
    hashed into the measurement cache's keys (voicebias.instruments.measure_cache)."""
    from voicebias import audio
    from voicebias.instruments import cepstrum, jit, measure_cache, units
    from voicebias.instruments import harmonicity as hm
    from voicebias.instruments import voice_quality as vq

    return {
        "read": [
            audio.load_for_analysis,
            audio.resample,
            audio.rms_dbfs,
            audio.clipped_fraction,
            audio._open,
            audio._decode,
            audio._wav_truncation,
            audio.AudioChecks,
            measure_cache._read_part,
        ],
        "pitch": [_Analysis.pitch, correct_octave_jumps, _pitch_measures, units.hz_to_semitones],
        "formants": [
            _Analysis.formants,
            dap_formants,
            harmonic_power,
            harmonic_window_s,
            _harmonic_peaks,
            vq._windowed_frames,
            discrete_all_pole,
            _dap_fit,
            _cholesky_toeplitz,
            _cholesky_inverse,
            _matvec,
            poles_to_formants,
            polynomial_roots,
            _aberth_sweeps,
            _aberth_roots,
            _pole_frequencies,
            _formant_measures,
            jit,
            repr(vq.FFT_CHUNK),
            repr(
                (
                    DAP_ORDER,
                    DAP_MIN_FORMANT_HZ,
                    DAP_MAX_BANDWIDTH_HZ,
                    DAP_ITERATIONS,
                    DAP_FRAMES_PER_CHUNK,
                    ROOT_ITERATIONS,
                    MALE_FORMANT_NORMS,
                )
            ),
        ],
        "harmonics": [
            vq.harmonic_levels,
            vq._hanning,
            vq._windowed_frames,
            vq._band_peaks,
            vq._band,
            vq.iseli_correction_db,
            vq.hawks_miller_bandwidth,
            jit,
            repr(vq.FFT_CHUNK),
            repr((vq._HM_LOW, vq._HM_HIGH)),
            _harmonic_measures,
        ],
        "cpps": [
            vq.cpps_db,
            vq.cepstrogram_cpps,
            vq._window_mean_weights,
            vq._regular_rows,
            vq._cpps_smoothed,
            vq._cpps_line_peaks,
            vq._theil_slopes,
            vq._median_near,
            vq._median_of_ranks,
            vq._select,
            repr(vq.CPPS_CHUNK),
            jit,
            vq.voiced_intervals,
            vq.CPPSSettings,
            _cpps_measures,
            cepstrum,
        ],
        "hnr": [
            vq.hnr_db,
            hm.harmonicity_at,
            hm.interpolation_weights,
            hm._coefficient_weights,
            hm._node_sums,
            hm._grid_weights,
            hm._Pieces,
            hm._apply_pieces,
            hm._screen,
            hm._normalised_correlation,
            hm._local_maxima,
            hm._chebyshev,
            hm._negative,
            hm._brent,
            hm._refine,
            hm._from_praat,
            jit,
            repr((hm.SINC_DEPTH, hm.CHEB_N, hm.SCREEN_STEPS, hm.SCREEN_MARGIN, hm.FLAT, hm._CORRELATION_CHUNK)),
            _hnr_measures,
        ],
    }


def components_for(settings: MeasureSettings, wanted: tuple[str, ...] | list[str] | None = None) -> tuple[str, ...]:
    """The components a file is measured with: `wanted` (default all of them) in
    COMPONENTS order, pitch and formants alone when `voice_quality` is off. Pitch and
    formants are always measured: every other component is taken at their frames, and
    a file without them is excluded."""
    chosen = COMPONENTS if wanted is None else tuple(c for c in COMPONENTS if c in wanted)
    unknown = sorted(set(wanted or ()) - set(COMPONENTS))
    if unknown:
        raise ConfigError(f"unknown measure components {unknown}; the instrument has {', '.join(COMPONENTS)}")
    if chosen[:2] != COMPONENTS[:2]:
        raise ConfigError(f"measure components must include pitch and formants, got {list(chosen)}")
    return chosen if settings.voice_quality else COMPONENTS[:2]


class _Analysis:
    """One signal's shared intermediate results (pitch track, formant tracks), computed
    once, on first use, whichever components ask for them."""

    def __init__(self, x: np.ndarray, sr: int, settings: MeasureSettings):
        self.x, self.sr, self.s = np.asarray(x, dtype=np.float64), sr, settings
        self._snd = self._pitch = self._formants = None

    @property
    def snd(self) -> parselmouth.Sound:
        if self._snd is None:
            self._snd = parselmouth.Sound(self.x, sampling_frequency=self.sr)
        return self._snd

    def pitch(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(all frame times, voiced mask, voiced times, voiced f0 in Hz); AudioError when
        fewer than three frames are voiced."""
        if self._pitch is None:
            s = self.s
            pitch = self.snd.to_pitch(s.time_step, s.pitch_floor, s.pitch_ceiling)
            f0 = pitch.selected_array["frequency"]
            voiced = f0 > 0
            if voiced.sum() < 3:
                raise AudioError("no voiced frames found: silent, noise-only or non-speech audio", code="no_voicing")
            f0_voiced = f0[voiced]
            if s.octave_check_st > 0:
                f0_voiced, _ = correct_octave_jumps(f0_voiced, s.octave_check_st)
            self._pitch = (pitch.xs(), voiced, pitch.xs()[voiced], f0_voiced)
        return self._pitch

    def formants(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(F1-F3 tracks at the voiced frames, measured bandwidths or None), Hz."""
        if self._formants is None:
            s, x, sr = self.s, self.x, self.sr
            _, _, times, f0_voiced = self.pitch()
            measured_bw = None
            if s.formant_method == "dap":
                tracks, measured_bw = dap_formants(x, sr, times, f0_voiced, s.max_formant)
            else:
                formant = self.snd.to_formant_burg(s.time_step, 5, s.max_formant, 0.025, 50.0)
                # Formant tracks at the voiced pitch frames (nearest formant frame).
                idx = np.clip(np.round((times - formant.x1) / formant.dx).astype(int), 0, formant.nx - 1)
                tracks = np.stack([call(formant, "To Matrix", i).values[0][idx] for i in (1, 2, 3)], axis=1)
                tracks[tracks <= 0] = np.nan
                if s.bandwidths == "measured":
                    ftimes = formant.x1 + idx * formant.dx
                    measured_bw = np.array(
                        [[formant.get_bandwidth_at_time(i, t) for i in (1, 2, 3)] for t in ftimes], dtype=float
                    )
                    measured_bw[~(measured_bw > 0)] = np.nan
            self._formants = (tracks, measured_bw if s.bandwidths == "measured" else None)
        return self._formants


def _pitch_measures(a: _Analysis) -> dict[str, float]:
    _, voiced, _, f0_voiced = a.pitch()
    f0_med = float(np.median(f0_voiced))
    return {
        "voiced_fraction": float(voiced.mean()),
        "f0_median_hz": f0_med,
        "f0_median_st": float(hz_to_semitones(f0_med)),
    }


def _formant_measures(a: _Analysis) -> dict[str, float]:
    tracks, _ = a.formants()
    frames = tracks[np.isfinite(tracks).all(axis=1)]
    if len(frames) < 3:
        raise AudioError("no voiced frames with three measurable formants", code="no_voicing")
    formants = [float(v) for v in np.median(frames, axis=0)]
    # The index is taken per frame, then summarised by its median over frames: F2's
    # frame distribution is bimodal (front vs back vowels), so an index built from
    # per-formant medians jumps with the vowel mix of the text.
    index = float(np.median(np.mean(np.log2(frames / np.array(MALE_FORMANT_NORMS)), axis=1)))
    return {"f1_hz": formants[0], "f2_hz": formants[1], "f3_hz": formants[2], "formant_index": index}


def _harmonic_measures(a: _Analysis) -> dict[str, float]:
    _, _, times, f0_voiced = a.pitch()
    tracks, bandwidths = a.formants()
    harmonics = harmonic_levels(a.x, a.sr, times, f0_voiced, tracks, bandwidths)

    def med(col: str) -> float:
        v = harmonics[col].to_numpy(float)
        v = v[np.isfinite(v)]
        return float(np.median(v)) if v.size else float("nan")

    return {c: med(c) for c in COMPONENT_MEASURES["harmonics"]}


def _cpps_measures(a: _Analysis) -> dict[str, float]:
    xs, voiced, _, _ = a.pitch()
    intervals = voiced_intervals(xs, voiced, a.s.time_step)
    return {"cpps_db": cpps_db(a.snd, intervals, CPPSSettings(time_step=a.s.cpps_time_step))}


def _hnr_measures(a: _Analysis) -> dict[str, float]:
    _, _, times, _ = a.pitch()
    return {"hnr_db": hnr_db(a.snd, times, a.s.time_step, a.s.pitch_floor)}


_COMPONENT_FUNCTIONS = {
    "pitch": _pitch_measures,
    "formants": _formant_measures,
    "harmonics": _harmonic_measures,
    "cpps": _cpps_measures,
    "hnr": _hnr_measures,
}


def pitch_frames(n_samples: int, sr: int, settings: MeasureSettings) -> int:
    """The number of frames Praat's pitch analysis gives a signal of `n_samples` samples at
    `sr` Hz (0: shorter than the window), by Praat's own arithmetic (Sampled_shortTermAnalysis):
    floor((duration - window) / time_step) + 1, window = PITCH_WINDOW_PERIODS / pitch_floor (s)."""
    duration, window = (1.0 / sr) * n_samples, PITCH_WINDOW_PERIODS / settings.pitch_floor
    return 0 if window > duration else math.floor((duration - window) / settings.time_step) + 1


def min_duration_s(settings: MeasureSettings) -> float:
    """The shortest signal (s) the measure set can measure with these settings: the pitch
    window plus MIN_VOICED_FRAMES - 1 time steps (module docstring, `too_short`)."""
    return min_analysable_s(settings.pitch_floor, settings.time_step)


def check_settings(settings: MeasureSettings) -> None:
    """ConfigError for a formant method or bandwidth source the instrument does not know."""
    if settings.bandwidths not in ("hawks_miller", "measured"):
        raise ConfigError(f"acoustics.bandwidths must be 'hawks_miller' or 'measured', not '{settings.bandwidths}'")
    if settings.formant_method not in ("dap", "burg"):
        raise ConfigError(f"acoustics.formant_method must be 'dap' or 'burg', not '{settings.formant_method}'")


def measure_components(
    x: np.ndarray, sr: int, settings: MeasureSettings, components: tuple[str, ...] | list[str]
) -> dict[str, dict[str, Any]]:
    """Measure the given components of one mono signal (sample rate `sr` Hz), in COMPONENTS
    order, sharing the pitch and formant tracks between them.

    Returns {component: {"values": {measure: value}}} for each component measured, or
    {"excluded": [code, message]} for the first one that cannot be measured (an
    AudioError: no voicing, no formants); components after it are not measured.
    Raises AudioError for a signal that cannot be analysed at all (`low_sample_rate`,
    `too_short`: shorter than min_duration_s)."""
    check_settings(settings)
    if sr < 2 * settings.max_formant:
        raise AudioError(
            f"sample rate {sr} Hz is below twice the formant ceiling ({settings.max_formant:g} Hz)",
            code="low_sample_rate",
        )
    if pitch_frames(len(x), sr, settings) < MIN_VOICED_FRAMES:
        raise AudioError(
            f"too short to measure: {1000 * len(x) / sr:.1f} ms; the pitch analysis (a window of "
            f"{PITCH_WINDOW_PERIODS:g} periods of the {settings.pitch_floor:g} Hz floor, "
            f"{MIN_VOICED_FRAMES} frames {settings.time_step:g} s apart) needs at least "
            f"{1000 * min_duration_s(settings):.1f} ms",
            code="too_short",
        )
    a = _Analysis(x, sr, settings)
    out: dict[str, dict[str, Any]] = {}
    for name in COMPONENTS:
        if name not in components:
            continue
        try:
            out[name] = {"values": _COMPONENT_FUNCTIONS[name](a)}
        except AudioError as exc:
            out[name] = {"excluded": [exc.code, str(exc)]}
            break
    return out


def measure_signal(x: np.ndarray, sr: int, settings: MeasureSettings) -> dict[str, float]:
    """Measure one mono signal (sample rate `sr` Hz); raises AudioError when it holds no
    voiced speech. Returns the MEASURE_COLUMNS (units in the module docstring)."""
    measured = measure_components(x, sr, settings, components_for(settings))
    row: dict[str, float] = {"duration_s": float(len(x) / sr)}
    for name, rec in measured.items():
        if "excluded" in rec:
            raise AudioError(rec["excluded"][1], code=rec["excluded"][0])
        row.update(rec["values"])
    return {c: row.get(c, float("nan")) for c in MEASURE_COLUMNS}


def measure_file(path: Path | str, settings: MeasureSettings, sample_rate: int = 16000) -> dict[str, Any]:
    """Check, read (mono, resampled to `sample_rate` Hz) and measure one file.

    Returns the measures plus a `note` listing conversions; raises AudioError."""
    loaded = load_for_analysis(path, target_sr=sample_rate, checks=settings.checks())
    return {**measure_signal(loaded.x, loaded.sr, settings), "note": "; ".join(loaded.notes)}


def measure_files(
    jobs: list[tuple],
    sample_rate: int = 16000,
    workers: int | None = None,
    desc: str = "measuring",
    cache_dir: Path | str | None = None,
    components: tuple[str, ...] | list[str] | None = None,
) -> pd.DataFrame:
    """Measure many files on all cores (one process per core, with a progress bar).

    jobs: (id, path, settings) or (id, path, settings, part), part one of
    voicebias.instruments.measure_cache.PARTS ('whole', the default; 'first_half',
    'second_half': the halves of the file as read). Returns one row per id: id, status
    ('ok' or 'excluded'), reason (code), error (readable), note, then MEASURE_COLUMNS
    (NaN for excluded files). A failing file never stops the rest of the batch: an
    error other than a refusal (AudioError) is that file's row, reason `measure_error`
    with the error's text.

    With `cache_dir`, every component of every file is looked up in the measurement
    cache there first (keyed by the audio's sha256, the part, the sample rate, the
    component's settings and code) and only missing components are measured; the
    counts go to `measure_files.last_counts` and to stderr. `components` (default all)
    names the components a stage uses (components_for); the measures of the others are
    NaN in the table, not measured. A cache entry that is damaged or of the wrong shape is
    measured again and counted (`corrupt` in the counts).
    """
    from voicebias.instruments.measure_cache import MeasureCache, measure_jobs

    cache = MeasureCache(cache_dir) if cache_dir is not None else None
    rows, counts = measure_jobs(
        jobs, sample_rate, workers or os.cpu_count() or 1, desc, cache, components, sys.modules[__name__]
    )
    measure_files.last_counts = counts
    if cache is not None:
        print(
            f"{desc}: {counts['files']} files; "
            + ", ".join(
                f"{c} {counts['measured'][c]} measured / {counts['cached'][c]} cached"
                for c in COMPONENTS
                if counts["measured"][c] or counts["cached"][c]
            )
            + (f"; {counts['corrupt']} damaged cache entries measured again" if counts["corrupt"] else ""),
            file=sys.stderr,
        )
    df = pd.DataFrame(rows, columns=["id", *STATUS_COLUMNS, *MEASURE_COLUMNS])
    for col in ("reason", "error", "note"):
        df[col] = df[col].fillna("").astype(str)
    return df


measure_files.last_counts = {}


def exclusion_counts(measures: pd.DataFrame) -> pd.DataFrame:
    """Counts of excluded files per reason code, plus conversions noted on accepted files.

    Returns columns kind ('excluded' or 'note'), reason, n."""
    rows = [
        {"kind": "excluded", "reason": r, "n": int(n)}
        for r, n in measures.loc[measures["status"] != "ok", "reason"].value_counts().sort_index().items()
    ]
    notes = measures.loc[measures["status"] == "ok", "note"].fillna("")
    kinds: dict[str, int] = {}
    for note in notes:
        for part in filter(None, (p.strip() for p in str(note).split(";"))):
            key = "resampled" if part.startswith("resampled") else "downmixed" if "averaged to mono" in part else part
            kinds[key] = kinds.get(key, 0) + 1
    rows += [{"kind": "note", "reason": k, "n": n} for k, n in sorted(kinds.items())]
    return pd.DataFrame(rows, columns=["kind", "reason", "n"])


def measure_table(
    table: pd.DataFrame,
    path_col: str,
    id_col: str,
    gender_col: str,
    params: dict[str, Any],
    root: Path,
    sample_rate: int,
    desc: str,
    cache_dir: Path | None = None,
    components: tuple[str, ...] | list[str] | None = None,
) -> pd.DataFrame:
    """Measure every file of a table with the analysis settings of its voice gender.

    Returns the table joined with the measures, status, reason, error and note columns.
    """
    jobs = [
        (r[id_col], root / r[path_col], MeasureSettings.for_gender(params, r[gender_col])) for _, r in table.iterrows()
    ]
    measures = measure_files(
        jobs, sample_rate=sample_rate, desc=desc, cache_dir=cache_dir, components=components
    ).rename(columns={"id": id_col})
    return table.merge(measures, on=id_col, how="left")


def classifier_names(acoustics_params: dict[str, Any]) -> list[str]:
    """The `acoustics.classifier` setting as a list (one name or several)."""
    c = acoustics_params["classifier"]
    return [c] if isinstance(c, str) else list(c)


def add_margins(
    df: pd.DataFrame, acoustics_params: dict[str, Any], root: Path, path_col: str = "path", sample_rate: int = 16000
) -> pd.DataFrame:
    """Add one margin_<classifier> column (z_female - z_male) per configured classifier.

    Classifiers that listen to the audio (wav2vec2) get the measured files, read as
    16 kHz mono; weights folders come from `acoustics.classifier_weights` and an
    explicit label order, where a checkpoint's config has generic label names, from
    `acoustics.classifier_labels` ({name: {female: i, male: j}}).
    """
    from voicebias.audio import read_audio
    from voicebias.instruments.classifiers import get_classifier

    ok = (df["status"] == "ok").to_numpy()
    weights = acoustics_params.get("classifier_weights") or {}
    labels = acoustics_params.get("classifier_labels") or {}
    audio = None
    for name in classifier_names(acoustics_params):
        options: dict[str, Any] = {"weights": root / weights[name]} if name in weights else {}
        if name in weights and acoustics_params.get("classifier_batch_size"):
            options["batch_size"] = int(acoustics_params["classifier_batch_size"])
        if name in labels:
            options["labels"] = dict(labels[name])
        clf = get_classifier(name, **options)
        if clf.needs_audio and audio is None:
            audio = [read_audio(root / p, target_sr=16000)[0] for p in df.loc[ok, path_col]]
        df[f"margin_{name}"] = np.nan
        if ok.any():
            df.loc[ok, f"margin_{name}"] = clf.margins(df[ok], audio=audio, sample_rate=16000)
    return df
