"""Formants F1-F4, the formant index and the vocal-tract index (component 'formants' of the measure set)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from parselmouth.praat import call

from voicebias.audio import AudioError
from voicebias.instruments.frames import FFT_CHUNK, windowed_frames
from voicebias.instruments.jit import kernel

#: the measures this component gives (voicebias.contract.MEASURE_COLUMNS)
MEASURES = ("f1_hz", "f2_hz", "f3_hz", "formant_index", "f4_hz", "vtl_index")


# Peterson & Barney (1952), Table II, adult men, averaged over the ten vowels (Hz).
MALE_FORMANT_NORMS = (502.0, 1420.0, 2386.0)


# F3 and F4 of Hillenbrand et al.'s (1995) 45 men, averaged over their 12 vowels (Hz: the mean
# of the vowels' means in the published measurement table, zeros for unmeasurable left out).
MALE_UPPER_FORMANT_NORMS = (2512.0, 3545.0)


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
        windowed_frames(x, starts[part], window, which[:k], lengths, frames)
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


def poles_to_formants(a: np.ndarray, ceiling: float, n: int = 3, *, next_formant: bool = False) -> tuple:
    """The lowest `n` formant frequencies and bandwidths (Hz) of predictor polynomials
    (frames, order + 1) on the band 0..`ceiling` Hz; with `next_formant`, a third array:
    the lowest formant-like pole above the n-th formant (Hz, NaN where there is none),
    which leaves the first `n` as they are.

    Poles above DAP_MIN_FORMANT_HZ and narrower than DAP_MAX_BANDWIDTH_HZ come first;
    where fewer than `n` qualify (a spectrum without formant peaks), the other poles
    of the band fill in, lowest first, as Praat's Burg analysis reports them. NaN
    where the band holds fewer than `n` poles. The poles are the polynomials' roots
    (polynomial_roots)."""
    roots = polynomial_roots(np.asarray(a, dtype=np.float64))
    freq, bw = _pole_frequencies(roots, float(ceiling))
    poles = freq
    in_band = (roots.imag > 0) & (freq > 50.0) & (freq < ceiling - 50.0)
    formant_like = in_band & (freq > DAP_MIN_FORMANT_HZ) & (bw < DAP_MAX_BANDWIDTH_HZ)
    # The model has one pole pair for the glottal source: where every pole pair looks like a
    # formant, the source's has strayed among them (at high F0, near F2), and the broadest goes.
    strayed = formant_like.sum(axis=1) >= DAP_ORDER // 2
    if strayed.any():
        broadest = np.argmax(np.where(formant_like, bw, -np.inf), axis=1)
        formant_like[np.flatnonzero(strayed), broadest[strayed]] = False
    rank = np.where(formant_like, freq, np.where(in_band, freq + 2 * ceiling, np.inf))
    chosen = np.argsort(rank, axis=1)[:, :n]
    freq = np.where(np.isfinite(np.take_along_axis(rank, chosen, 1)), np.take_along_axis(freq, chosen, 1), np.nan)
    bw = np.where(np.isfinite(freq), np.take_along_axis(bw, chosen, 1), np.nan)
    by_freq = np.argsort(np.where(np.isfinite(freq), freq, np.inf), axis=1)
    freq, bw = np.take_along_axis(freq, by_freq, 1), np.take_along_axis(bw, by_freq, 1)
    if not next_formant:
        return freq, bw
    above = formant_like & (poles > np.where(np.isfinite(freq[:, -1]), freq[:, -1], np.inf)[:, None])
    following = np.min(np.where(above, poles, np.inf), axis=1)
    return freq, bw, np.where(np.isfinite(following), following, np.nan)


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
    modelling of the harmonics below `ceiling` Hz, and F4. Returns two (frames, 3) arrays, NaN
    where a frame yields fewer than three formants, and a (frames,) array of F4 (the next
    formant-like pole above F3; NaN where none lies below the ceiling)."""
    f0 = np.asarray(f0, dtype=float)
    times = np.asarray(times, dtype=float)
    x = np.asarray(x, dtype=np.float64)
    window_s = harmonic_window_s(f0)
    tracks, bandwidths = np.full((len(f0), 3), np.nan), np.full((len(f0), 3), np.nan)
    f4 = np.full(len(f0), np.nan)
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
            tracks[rows], bandwidths[rows], f4[rows] = poles_to_formants(a[fitted], ceiling, next_formant=True)
    return tracks, bandwidths, f4


def formant_index(f1, f2, f3) -> np.ndarray:
    """Mean log2 ratio of F1-F3 to adult-male norms (octaves; 0 = male norm), per frame."""
    return np.mean(np.log2(np.stack([f1, f2, f3], axis=-1) / np.array(MALE_FORMANT_NORMS)), axis=-1)


def vtl_index(f3, f4) -> np.ndarray:
    """Vocal-tract index (octaves; 0 = adult-male norm, higher = shorter tract), per frame:
    the mean log2 ratio of F3 and F4 to MALE_UPPER_FORMANT_NORMS; F3's alone where F4 is NaN.

    In a uniform tube closed at the glottis, Fn = (2n - 1) c / 4L, so each formant's log
    ratio to a reference speaker's is log2(L_ref / L): the index is the log of the apparent
    vocal-tract length ratio (male norm over speaker) from the two formants least shaped by
    articulation (Lammert & Narayanan, 2015, PLoS ONE 10(7): e0132193) and least moved by F0
    (docs/formants.md, "F0 invariance on Hillenbrand's vowels")."""
    r3 = np.log2(np.asarray(f3, float) / MALE_UPPER_FORMANT_NORMS[0])
    r4 = np.log2(np.asarray(f4, float) / MALE_UPPER_FORMANT_NORMS[1])
    return np.where(np.isfinite(r4), (r3 + r4) / 2, r3)


def measure(a: Any) -> dict[str, float]:
    """The formant measures of the analysed signal `a` (voicebias.instruments.acoustics' shared analysis).

    F1-F3 and the formant index over the voiced frames with three formants; F4 and the
    vocal-tract index over those that also have a fourth below the ceiling. Where fewer than
    three frames do, F4 is NaN and the vocal-tract index is F3's alone over the frames with
    three formants, so that one estimator makes each file's median."""
    tracks, _ = a.formants()
    found = np.isfinite(tracks).all(axis=1)
    frames = tracks[found]
    if len(frames) < 3:
        raise AudioError("no voiced frames with three measurable formants", code="no_voicing")
    formants = [float(v) for v in np.median(frames, axis=0)]
    # The index is taken per frame, then summarised by its median over frames: F2's
    # frame distribution is bimodal (front vs back vowels), so an index built from
    # per-formant medians jumps with the vowel mix of the text.
    index = float(np.median(np.mean(np.log2(frames / np.array(MALE_FORMANT_NORMS)), axis=1)))
    f4 = a.f4()[found]
    upper = np.isfinite(f4)
    if upper.sum() >= 3:
        f4_hz = float(np.median(f4[upper]))
        vtl = float(np.median(vtl_index(frames[upper, 2], f4[upper])))
    else:
        f4_hz = float("nan")
        vtl = float(np.median(vtl_index(frames[:, 2], np.full(len(frames), np.nan))))
    return {
        "f1_hz": formants[0],
        "f2_hz": formants[1],
        "f3_hz": formants[2],
        "formant_index": index,
        "f4_hz": f4_hz,
        "vtl_index": vtl,
    }


def formant_tracks(a) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(F1-F3 tracks at the voiced frames, measured bandwidths or None, F4 track), Hz, of the
    signal `a` (voicebias.instruments.acoustics' shared analysis: its pitch track, samples and settings)."""
    s, x, sr = a.s, a.x, a.sr
    _, _, times, f0_voiced = a.pitch()
    measured_bw = None
    if s.formant_method == "dap":
        tracks, measured_bw, f4 = dap_formants(x, sr, times, f0_voiced, s.max_formant)
    else:
        formant = a.snd.to_formant_burg(s.time_step, 5, s.max_formant, 0.025, 50.0)
        # Formant tracks at the voiced pitch frames (nearest formant frame).
        idx = np.clip(np.round((times - formant.x1) / formant.dx).astype(int), 0, formant.nx - 1)
        tracks = np.stack([call(formant, "To Matrix", i).values[0][idx] for i in (1, 2, 3, 4)], axis=1)
        tracks[tracks <= 0] = np.nan
        tracks, f4 = tracks[:, :3], tracks[:, 3]
        if s.bandwidths == "measured":
            ftimes = formant.x1 + idx * formant.dx
            measured_bw = np.array(
                [[formant.get_bandwidth_at_time(i, t) for i in (1, 2, 3)] for t in ftimes], dtype=float
            )
            measured_bw[~(measured_bw > 0)] = np.nan
    return (tracks, measured_bw if s.bandwidths == "measured" else None, f4)
