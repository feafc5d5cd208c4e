"""Voice-quality measures: H1-H2, H1-A3 (uncorrected and Iseli-corrected), CPPS, HNR.

Harmonic levels follow PraatSauce (Kirby): per analysis frame, a short spectrum
centred on the frame; H1 is the highest level within f0 +- f0/10, H2 within
2 f0 +- f0/10 and A3 within F3 +- F3/10 (f0 from Praat's pitch track, F3 from the
formant track of voicebias.instruments.acoustics at that frame). The spectrum of each frame is
computed here with numpy: a Hann window `n_periods` pitch periods long, zero-padded
eightfold, levels in dB (20 log10 of the magnitude; an arbitrary common reference, so only
differences such as H1-H2 mean anything) with parabolic interpolation of the peak.
Six periods put a neighbouring harmonic six bins away, where the Hann window's
leakage is below -50 dB, so H1-H2 is read to a few hundredths of a dB on a
stationary voice.

Corrected levels (H1*, H2*, A3*) remove the vocal-tract boost each formant gives
at the harmonic's frequency (Iseli, Shue & Alwan, 2007, JASA 121(4):2283-2295,
eq. for a second-order resonator normalised to unit gain at 0 Hz):

    |H_i(f)|^2 = (1 - 2 r cos w_i + r^2)^2 /
                 ((1 - 2 r cos(w + w_i) + r^2) (1 - 2 r cos(w - w_i) + r^2)),
    r = exp(-pi B_i / fs), w_i = 2 pi F_i / fs, w = 2 pi f / fs,

with the formant frequencies F_i measured at the frame (voicebias.instruments.acoustics).
Bandwidths B_i come by default from the Hawks & Miller (1995, JASA 97(2):1343-1344)
formula of formant frequency and f0, as in VoiceSauce and PraatSauce, because
LPC bandwidths are noisy (on a synthetic vowel Burg read B3 = 300 Hz for a true
140 Hz, moving A3* by 4 dB); `bandwidths="measured"` uses those of the formant analysis instead. As in
VoiceSauce, H1 and H2 are corrected for F1 and F2, A3 for F1, F2 and F3. Per-frame values are
summarised by their median over voiced frames.

CPPS (smoothed cepstral peak prominence, dB) is Praat's "Get CPPS" on a
PowerCepstrogram of the voiced stretches only (pauses would lower it), with the
argument lists of Praat 6.1.38 as bundled in parselmouth 0.4.7. The cepstrogram is
Praat's algorithm re-expressed by voicebias.instruments.cepstrum; its "Get CPPS"
(smoothing, trend line, peak search, mean over frames) is evaluated here by
`cepstrogram_cpps`, a few frames at a time in compiled loops
(voicebias.instruments.jit), following Praat 6.1.38's definition step by step; it
agrees with Praat to 1e-12 dB (tests/unit/instruments/test_voice_quality.py) at a
fraction of its cost. HNR (dB) is
Praat's cross-correlation harmonicity, median over voiced frames, computed at those
frames only by voicebias.instruments.harmonicity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd
import parselmouth
from parselmouth.praat import call

from voicebias.instruments.jit import kernel

#: values per batch of zero-padded frames transformed at once: small enough that a batch
#: and its spectra stay in the processor's cache (a whole file's frames at once spend
#: about as long writing memory as transforming)
FFT_CHUNK = 1 << 17


@dataclass(frozen=True)
class CPPSSettings:
    """Praat 'To PowerCepstrogram' and 'Get CPPS' arguments (Hz, s, dB)."""

    pitch_floor: float = 60.0
    time_step: float = 0.002
    max_frequency: float = 5000.0
    pre_emphasis_from: float = 50.0
    time_averaging_window: float = 0.02
    quefrency_averaging_window: float = 0.0005
    peak_search_min_f0: float = 60.0
    peak_search_max_f0: float = 330.0
    tolerance: float = 0.05


def iseli_correction_db(f_hz, formant_hz, bandwidth_hz, sr: float) -> np.ndarray:
    """Gain (dB) of a unit-DC-gain digital resonator at F, B (Hz) at frequency f (Hz).

    Subtracting it from a measured harmonic level removes that formant's boost
    (Iseli et al., 2007). Broadcasts over arrays; NaN where an input is NaN.
    """
    f, F, B = (np.asarray(v, dtype=float) for v in (f_hz, formant_hz, bandwidth_hz))
    r = np.exp(-np.pi * B / sr)
    wi, w = 2 * np.pi * F / sr, 2 * np.pi * f / sr
    num = (1 - 2 * r * np.cos(wi) + r**2) ** 2
    den = (1 - 2 * r * np.cos(w + wi) + r**2) * (1 - 2 * r * np.cos(w - wi) + r**2)
    return 10.0 * np.log10(num / den)


# Hawks & Miller (1995), eq. 1: bandwidth (Hz) as a 5th-order polynomial of the formant
# frequency, one set of coefficients below 500 Hz and one above, scaled by f0.
_HM_LOW = (165.327516, -6.73636734e-1, 1.80874446e-3, -4.52201682e-6, 7.49514000e-9, -4.70219241e-12)
_HM_HIGH = (15.8146139, 8.10159009e-2, -9.79728215e-5, 5.28725064e-8, -1.07099364e-11, 7.91528509e-16)


def hawks_miller_bandwidth(formant_hz, f0_hz) -> np.ndarray:
    """Formant bandwidth (Hz) predicted from formant frequency and f0 (Hz), Hawks & Miller (1995)."""
    F = np.asarray(formant_hz, dtype=float)
    scale = 1.0 + 0.25 * (np.asarray(f0_hz, dtype=float) - 132.0) / 88.0
    low = sum(c * F**k for k, c in enumerate(_HM_LOW))
    high = sum(c * F**k for k, c in enumerate(_HM_HIGH))
    return scale * np.where(F < 500.0, low, high)


@kernel
def _windowed_frames(x, starts, windows, which, lengths, out):  # pragma: no cover - compiled
    """Frames of x for a batch of zero-padded FFTs, into the rows of `out`: row r holds
    x[starts[r] + j] * windows[which[r], j] for j < lengths[which[r]] (zero where that
    sample lies outside x), then zeros up to the longest window; the rest of the row is
    left as it is (zero: the buffer is reused for frames of one FFT length)."""
    for r in range(starts.shape[0]):
        w, s = which[r], starts[r]
        inside_from, inside_to = max(0, -s), max(0, min(lengths[w], x.shape[0] - s))
        for j in range(min(inside_from, lengths[w])):
            out[r, j] = 0.0
        for j in range(inside_from, inside_to):
            out[r, j] = x[s + j] * windows[w, j]
        for j in range(max(inside_from, inside_to), windows.shape[1]):
            out[r, j] = 0.0


@kernel
def _band_peaks(spec, n_bins, df, freqs, i0, i1, level, at):  # pragma: no cover - compiled
    """Per row of the complex spectra `spec` (its first n_bins bins, at frequencies
    freqs, df apart): the highest level 20 log10 |spec| (dB, floored at -240) over bins
    i0..i1-1 into `level`, parabolic-interpolated through its neighbours where it is
    not at the spectrum's edge, and its frequency (Hz) into `at` (the first bin of a
    tie; the search compares squared magnitudes, floored at 1e-24). Rows with i1 <= i0
    are left alone."""
    for t in range(spec.shape[0]):
        if i1[t] <= i0[t]:
            continue
        k, best = i0[t], -1.0
        for b in range(i0[t], i1[t]):
            v = max(spec[t, b].real * spec[t, b].real + spec[t, b].imag * spec[t, b].imag, 1e-24)
            if v > best:
                k, best = b, v
        b = 20 * math.log10(max(math.hypot(spec[t, k].real, spec[t, k].imag), 1e-12))
        if 0 < k < n_bins - 1:
            a = 20 * math.log10(max(math.hypot(spec[t, k - 1].real, spec[t, k - 1].imag), 1e-12))
            c = 20 * math.log10(max(math.hypot(spec[t, k + 1].real, spec[t, k + 1].imag), 1e-12))
            denom = a - 2 * b + c
            p = 0.5 * (a - c) / denom if denom < 0 else 0.0
            level[t] = b - 0.25 * (a - c) * p
            at[t] = freqs[k] + p * df
        else:
            level[t], at[t] = b, freqs[k]


def _band(freqs: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bins [i0, i1) of `freqs` (Hz, ascending) within [lo, hi] Hz, per row; an
    empty range (i1 = i0) where a bound is NaN or no bin lies inside."""
    finite = np.isfinite(lo) & np.isfinite(hi)
    i0 = np.searchsorted(freqs, np.where(finite, lo, 0.0))
    i1 = np.searchsorted(freqs, np.where(finite, hi, 0.0), side="right")
    return i0, np.where(finite & (i1 > i0), i1, i0)


@lru_cache(maxsize=4096)
def _hanning(m: int) -> np.ndarray:
    """numpy.hanning(m), kept: the frames of a file come in a few hundred lengths."""
    return np.hanning(m)


def harmonic_levels(
    x: np.ndarray,
    sr: int,
    times: np.ndarray,
    f0: np.ndarray,
    formants: np.ndarray,
    bandwidths: np.ndarray | None = None,
    n_periods: float = 6.0,
) -> pd.DataFrame:
    """Per-frame harmonic levels and their differences (dB).

    x: mono signal; times (s), f0 (Hz): voiced frames; formants, bandwidths:
    arrays of shape (n_frames, 3) holding F1-F3 and B1-B3 (Hz) at those frames (NaN
    where Praat found none: the corrected values are then NaN too); bandwidths
    None = Hawks & Miller bandwidths from F1-F3 and f0.
    Returns one row per frame: time_s, f0_hz, h1_db, h2_db, a3_db, a3_hz, the
    corrected h1c_db, h2c_db, a3c_db, and h1_h2_db, h1_a3_db, h1_h2_corrected_db,
    h1_a3_corrected_db. Frames whose window would run past either end of the signal
    are left out.

    Frames that share an FFT length (a power of two at least eight times the window)
    are windowed into zero-padded batches of FFT_CHUNK values and transformed together;
    each band's peak is searched at the bins it holds (`_band_peaks`), and the
    corrections run on whole arrays.
    """
    x = np.asarray(x, dtype=np.float64)
    times = np.asarray(times, dtype=float)
    f0 = np.asarray(f0, dtype=float)
    formants = np.asarray(formants, dtype=float).reshape(len(f0), 3)
    if bandwidths is None:
        bandwidths = hawks_miller_bandwidth(formants, f0[:, None])
    bandwidths = np.asarray(bandwidths, dtype=float).reshape(len(f0), 3)
    columns = ["time_s", "f0_hz", "h1_db", "h2_db", "a3_db", "a3_hz", "h1c_db", "h2c_db", "a3c_db"]
    good = np.isfinite(f0) & (f0 > 0)
    n = np.zeros(len(f0), dtype=int)
    n[good] = np.round(n_periods * sr / f0[good]).astype(int)
    start = np.round(times * sr).astype(int) - n // 2
    keep = np.flatnonzero(good & (start >= 0) & (start + n <= len(x)))
    out = {c: np.full(len(keep), np.nan) for c in columns}
    out["time_s"], out["f0_hz"] = times[keep], f0[keep]
    nfft = 1 << np.ceil(np.log2(8 * n[keep])).astype(np.int64)
    for size in np.unique(nfft):
        sel = np.flatnonzero(nfft == size)
        rows = keep[sel]
        lengths, which = np.unique(n[rows], return_inverse=True)
        hann = np.zeros((len(lengths), int(lengths.max())))  # a Hann window of each frame length
        for i, m in enumerate(lengths.tolist()):
            hann[i, :m] = _hanning(m)
        freqs = np.fft.rfftfreq(int(size), 1.0 / sr)
        f, fm, bw = f0[rows], formants[rows], bandwidths[rows]
        # levels only up to the bin past the highest band searched (A3's, else H2's)
        top = np.nanmax(np.concatenate([2.1 * f, 1.1 * fm[:, 2]]))
        last = min(len(freqs), int(np.searchsorted(freqs, top, side="right")) + 2)
        freqs = np.ascontiguousarray(freqs[:last])
        bands = [
            _band(freqs, lo, hi)
            for lo, hi in ((0.9 * f, 1.1 * f), (1.9 * f, 2.1 * f), (0.9 * fm[:, 2], 1.1 * fm[:, 2]))
        ]
        level, at = np.full((3, len(rows)), np.nan), np.full((3, len(rows)), np.nan)
        step = max(1, FFT_CHUNK // int(size))
        frames = np.zeros((min(step, len(rows)), int(size)))
        spectra = np.empty((len(frames), int(size) // 2 + 1), dtype=complex)
        for lo in range(0, len(rows), step):
            part = slice(lo, lo + step)
            k = len(rows[part])
            _windowed_frames(x, start[rows[part]], hann, which[part].astype(np.int64), lengths, frames)
            spec = np.fft.rfft(frames[:k], axis=1, out=spectra[:k])
            for j, (i0, i1) in enumerate(bands):
                _band_peaks(spec, last, freqs[1] - freqs[0], freqs, i0[part], i1[part], level[j, part], at[j, part])
        (h1, h2, a3), (fh1, fh2, fa3) = level, at

        def c12(fr: np.ndarray) -> np.ndarray:
            return iseli_correction_db(fr, fm[:, 0], bw[:, 0], sr) + iseli_correction_db(fr, fm[:, 1], bw[:, 1], sr)

        with np.errstate(invalid="ignore", divide="ignore"):
            vals = {
                "h1_db": h1,
                "h2_db": h2,
                "a3_db": a3,
                "a3_hz": fa3,
                "h1c_db": h1 - c12(fh1),
                "h2c_db": h2 - c12(fh2),
                "a3c_db": a3 - c12(fa3) - iseli_correction_db(fa3, fm[:, 2], bw[:, 2], sr),
            }
        for c, v in vals.items():
            out[c][sel] = v
    out["h1_h2_db"] = out["h1_db"] - out["h2_db"]
    out["h1_a3_db"] = out["h1_db"] - out["a3_db"]
    out["h1_h2_corrected_db"] = out["h1c_db"] - out["h2c_db"]
    out["h1_a3_corrected_db"] = out["h1c_db"] - out["a3c_db"]
    return pd.DataFrame(out)


def voiced_intervals(
    times: np.ndarray, voiced: np.ndarray, time_step: float, min_duration: float = 0.0
) -> list[tuple[float, float]]:
    """(start, end) in seconds of runs of voiced frames, each frame covering +- time_step/2."""
    t = np.asarray(times, dtype=float)
    edges = np.diff(np.concatenate([[0], np.asarray(voiced, dtype=bool).astype(np.int8), [0]]))
    firsts, lasts = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
    out = [(float(t[a]) - time_step / 2, float(t[b]) + time_step / 2) for a, b in zip(firsts, lasts)]
    return [(a, b) for a, b in out if b - a >= min_duration]


def _window_mean_weights(
    n: int, x1: float, dx: float, domain: tuple[float, float], mids: np.ndarray, half: float
) -> tuple[np.ndarray, np.ndarray]:
    """Praat's mean of a sampled function over [mid - half, mid + half] (Sampled_getMean
    with linear interpolation: the area under the piecewise-linear curve through the
    samples x1 + i dx, i = 0..n-1, divided by the length it covers, both clipped to
    `domain`), written as weights: mean_k = sum_j weights[k, j] v[first[k] + j].
    Every sample value must be defined. Returns (first, weights)."""
    lo = np.maximum(mids - half, domain[0])
    hi = np.minimum(mids + half, domain[1])
    imin = np.maximum(np.ceil((lo - x1) / dx), 0).astype(int)  # first sample centre inside
    imax = np.minimum(np.floor((hi - x1) / dx), n - 1).astype(int)  # last one
    if np.any(imin > imax):
        raise ValueError("an averaging window holds no sample centre")
    inside = imax - imin + 1
    cols = np.arange(int(inside.max()) + 2)[None, :]
    w = ((cols >= 1) & (cols <= inside[:, None])).astype(float)  # column 0 is sample imin - 1
    cover = inside.astype(float)
    rows = np.arange(len(mids))
    left_edge = x1 - 0.5 * dx
    right_edge = left_edge + n * dx
    # Each sample counts for one sampling interval around it; where the window ends
    # inside the curve's domain, that half interval is replaced by the interpolated
    # area between the window's end and the sample (or, at the last sample, by at
    # most half an interval of its constant value).
    for end, phase, j, j_out, has_out in (
        (lo > left_edge, (x1 + imin * dx - lo) / dx, np.ones_like(imin), np.zeros_like(imin), imin >= 1),
        (hi < right_edge, (hi - (x1 + imax * dx)) / dx, inside, inside + 1, imax + 1 <= n - 1),
    ):
        phase = np.where(has_out, phase, np.minimum(phase, 0.5))
        w[rows, j] += np.where(end, -0.5 + np.where(has_out, phase - 0.5 * phase * phase, phase), 0.0)
        w[rows, j_out] += np.where(end & has_out, 0.5 * phase * phase, 0.0)
        cover += np.where(end, phase - 0.5, 0.0)
    return imin - 1, w / cover[:, None]


def cepstrogram_cpps(
    power: np.ndarray,
    x1: float,
    dx: float,
    domain: tuple[float, float],
    qmax: float,
    settings: CPPSSettings = CPPSSettings(),
) -> float:
    """CPPS (dB) of a power cepstrogram as Praat 6.1.38's "Get CPPS" computes it with
    voicebias's arguments (no trend subtraction before smoothing; parabolic peak
    interpolation; a straight trend line fitted by Theil's incomplete method over the
    whole quefrency range, which is what the trend range 0.001..0 s selects).

    power: the cepstrogram's values, shape (quefrencies, frames), quefrency 0..qmax s
    in equal steps; frames at x1 + i dx s on the time `domain` (xmin, xmax) s.
    Steps, per Praat: (1) each quefrency row is averaged over time_averaging_window
    s around each frame and (2) each frame over quefrency_averaging_window s around
    each quefrency (window means of the linearly interpolated values, see
    _window_mean_weights; a step is skipped when its window is not longer than the
    sampling step); (3) per frame, the levels 10 log10(power + 1e-30) get a straight
    line by Theil's incomplete method (the slopes between the points of the first and
    second halves, their median; the intercept is the median of level minus slope
    times quefrency); (4) the peak is the highest level in 1/peak_search_max_f0 ..
    1/peak_search_min_f0 s: the larger of the two end samples, or a local maximum
    inside, refined by a parabola through it and its neighbours where that exceeds
    the ends; (5) the frame's prominence is the peak minus the line at the peak's
    quefrency, and CPPS is the mean of the prominences over frames."""
    s = settings
    nq, nx = power.shape
    dq = qmax / (nq - 1)
    z = np.ascontiguousarray(np.asarray(power, dtype=np.float64).T)  # (frames, quefrencies)
    smooth_t = bool(np.floor(s.time_averaging_window / dx) > 1)
    smooth_q = bool(s.quefrency_averaging_window / dq > 1.0)
    t_first, t_w = (
        _window_mean_weights(nx, x1, dx, domain, x1 + np.arange(nx) * dx, 0.5 * s.time_averaging_window)
        if smooth_t
        else (np.zeros(nx, dtype=np.int64), np.zeros((nx, 1)))
    )
    q_first, q_w = (
        _window_mean_weights(nq, 0.0, dq, (0.0, qmax), np.arange(nq) * dq, 0.5 * s.quefrency_averaging_window)
        if smooth_q
        else (np.zeros(nq, dtype=np.int64), np.zeros((nq, 1)))
    )
    q_lo, q_hi = 1.0 / s.peak_search_max_f0, 1.0 / s.peak_search_min_f0
    i_lo = max(int(np.ceil(q_lo / dq)), 0)
    i_hi = min(int(np.floor(q_hi / dq)), nq - 1)
    t_first, q_first = t_first.astype(np.int64), q_first.astype(np.int64)
    q_w_t, regular = np.ascontiguousarray(q_w.T), _regular_rows(q_first, q_w.shape[1], nq)
    q = np.arange(nq) * dq
    prominence = np.empty(nx)
    step = max(1, CPPS_CHUNK // nq)
    for lo in range(0, nx, step):
        hi = min(nx, lo + step)
        level = _cpps_smoothed(z, lo, hi, smooth_t, t_first, t_w, smooth_q, q_first, q_w, q_w_t, regular)
        level += 1e-30
        np.log10(level, out=level)
        level *= 10.0
        _cpps_line_peaks(level, q, dq, i_lo, i_hi, q_lo, q_hi, prominence[lo:hi])
    return float(np.mean(prominence))


#: values per batch of smoothed cepstrogram frames (small enough to stay in cache)
CPPS_CHUNK = 1 << 17


def _regular_rows(first: np.ndarray, width: int, n: int) -> np.ndarray:
    """(start, stop, offset): the longest run of rows i whose window starts at
    first[i] = i + offset and lies wholly inside 0..n-1 (an empty run if none)."""
    offset = first - np.arange(len(first))
    inside = (first >= 0) & (first + width <= n)
    best = (0, 0, 0)
    i = 0
    while i < len(first):
        j = i
        while j < len(first) and inside[j] and offset[j] == offset[i]:
            j += 1
        if j - i > best[1] - best[0]:
            best = (i, j, int(offset[i]))
        i = max(j, i + 1)
    return np.array(best, dtype=np.int64)


@kernel
def _cpps_smoothed(
    z, lo, hi, smooth_t, t_first, t_w, smooth_q, q_first, q_w, q_w_t, regular
):  # pragma: no cover - compiled
    """Steps (1) and (2) of `cepstrogram_cpps` for the frames lo..hi-1 of z (frames,
    quefrencies): sum_j t_w[k, j] z[t_first[k] + j] over time, then the same with q_w,
    q_first along each frame, each sum taken in order of j over the indices inside the
    array (the weights of `_window_mean_weights`). The quefrency rows of the `regular`
    run (_regular_rows), whose windows are the same shape, are summed along the
    window's diagonals (q_w_t is q_w transposed), the others one by one."""
    nx, nq = z.shape
    width = q_w.shape[1]
    start, stop, offset = regular[0], regular[1], regular[2]
    out = np.empty((hi - lo, nq))
    row = np.empty(nq)
    for k in range(lo, hi):
        if smooth_t:
            row[:] = 0.0
            for j in range(max(0, -t_first[k]), min(t_w.shape[1], nx - t_first[k])):
                w, c = t_w[k, j], t_first[k] + j
                for i in range(nq):
                    row[i] += w * z[c, i]
        else:
            row[:] = z[k]
        o = out[k - lo]
        if not smooth_q:
            o[:] = row
            continue
        for i in range(nq):
            if start <= i < stop:
                o[i] = 0.0
                continue
            acc = 0.0
            for j in range(max(0, -q_first[i]), min(width, nq - q_first[i])):
                acc += q_w[i, j] * row[q_first[i] + j]
            o[i] = acc
        for j in range(width):
            w = q_w_t[j, start:stop]
            src = row[start + offset + j : stop + offset + j]
            dst = o[start:stop]
            for i in range(stop - start):
                dst[i] += w[i] * src[i]
    return out


@kernel
def _cpps_line_peaks(level, q, dq, i_lo, i_hi, q_lo, q_hi, out):  # pragma: no cover - compiled
    """Steps (3)-(5) of `cepstrogram_cpps` on the levels (dB) of each frame (rows of
    `level`, at quefrencies q s, dq apart): the prominence of each frame (dB) into out."""
    nx, nq = level.shape
    half = nq // 2
    second = half + nq % 2
    values, scratch = np.empty(nq), np.empty(nq)
    slope_at = np.array([np.nan, 0.0])  # each median's last value and search half-width
    intercept_at = np.array([np.nan, 0.0])
    for k in range(nx):
        v = level[k]
        _theil_slopes(v, q, half, second, values)
        slope = _median_near(values, half, slope_at, scratch)
        for i in range(nq):
            values[i] = v[i] - slope * q[i]
        intercept = _median_near(values, nq, intercept_at, scratch)
        peak = max(v[i_lo], v[i_hi])
        at = float(i_hi) if v[i_hi] > v[i_lo] else float(i_lo)
        best, best_at = -np.inf, 0.0
        for i in range(max(i_lo, 1), min(i_hi, nq - 2) + 1):
            mid, left, right = v[i], v[i - 1], v[i + 1]
            if mid > left and mid >= right:
                d1 = 0.5 * (right - left)
                d2 = 2.0 * mid - left - right
                refined = mid + 0.5 * d1 * d1 / d2
                if refined > best:  # the first of equal maxima, as Praat's scan keeps
                    best, best_at = refined, i + d1 / d2
        if best > peak:
            peak, at = best, best_at
        q_peak = min(max(at * dq, q_lo), q_hi)
        out[k] = peak - (slope * q_peak + intercept)


@kernel
def _theil_slopes(v, q, half, second, out):  # pragma: no cover - compiled
    """The slopes (v[second + i] - v[i]) / (q[second + i] - q[i]), i < half, into out."""
    for i in range(half):
        out[i] = (v[second + i] - v[i]) / (q[second + i] - q[i])


@kernel
def _median_near(a, n, near, scratch):  # pragma: no cover - compiled
    """Median of a[:n] (the mean of the two middle values for an even n), exactly,
    looking first near a guess: near = [guess, half-width]. One pass counts the values
    below guess - half-width and gathers those within the window into `scratch`; if
    the middle ranks fall among them, they are selected there, otherwise in all of
    a[:n]. `near` is then set to this median and a half-width that keeps a few dozen
    values in the window (neighbouring cepstrogram frames have close medians).
    Reorders a[:n]."""
    k = n // 2
    low_rank = k if n % 2 else k - 1
    guess, width = near[0], near[1]
    lo, hi = guess - width, guess + width
    below, m = 0, 0
    if width > 0.0:  # a NaN guess or a zero width looks nowhere
        for i in range(n):
            x = a[i]
            if x < lo:
                below += 1
            scratch[m] = x
            if lo <= x <= hi:
                m += 1
    if width > 0.0 and below <= low_rank and k < below + m:
        median = _median_of_ranks(scratch, m, low_rank - below, k - below)
        if m > 64:
            near[1] = 0.5 * width
    else:
        median = _median_of_ranks(a, n, low_rank, k)
        near[1] = 4.0 * width if width > 0.0 else 1e-3 * (abs(median) + 1e-6)
    near[0] = median
    return median


@kernel
def _median_of_ranks(a, n, r0, r1):  # pragma: no cover - compiled
    """The mean of the r0-th and r1-th smallest of a[:n] (r0 = r1 - 1 or r1), by
    selection; reorders a[:n]."""
    upper = _select(a, n, r1)
    if r0 == r1:
        return upper
    lower = a[0]
    for i in range(1, r1):  # after the selection a[:r1] holds the r1 smallest
        if a[i] > lower:
            lower = a[i]
    return 0.5 * (lower + upper)


@kernel
def _select(a, n, k):  # pragma: no cover - compiled
    """The k-th smallest of a[:n] (0-based), by Hoare's selection with a median-of-three
    pivot; afterwards a[:k] holds values no larger and a[k + 1:n] none smaller."""
    lo, hi = 0, n - 1
    while hi > lo:
        mid = (lo + hi) // 2
        if a[mid] < a[lo]:
            a[mid], a[lo] = a[lo], a[mid]
        if a[hi] < a[lo]:
            a[hi], a[lo] = a[lo], a[hi]
        if a[hi] < a[mid]:
            a[hi], a[mid] = a[mid], a[hi]
        pivot = a[mid]
        i, j = lo, hi
        while i <= j:
            while a[i] < pivot:
                i += 1
            while a[j] > pivot:
                j -= 1
            if i <= j:
                a[i], a[j] = a[j], a[i]
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            break
    return a[k]


def cpps_db(
    snd: parselmouth.Sound, intervals: list[tuple[float, float]] | None = None, settings: CPPSSettings = CPPSSettings()
) -> float:
    """Smoothed cepstral peak prominence (dB) of the sound, or of the given voiced
    intervals (s) joined end to end: Praat's PowerCepstrogram (computed by
    voicebias.instruments.cepstrum.power_cepstrogram), then cepstrogram_cpps."""
    from voicebias.instruments.cepstrum import power_cepstrogram

    x, sr = snd.values[0], snd.sampling_frequency  # the samples, on a time axis from 0
    if intervals is not None:
        parts = [x[max(0, int(a * sr)) : int(np.ceil(b * sr))] for a, b in intervals]
        parts = [p for p in parts if p.size]
        if not parts:
            return float("nan")
        x = np.concatenate(parts)
    s = settings
    values, x1, dx, domain, qmax = power_cepstrogram(
        x, sr, s.pitch_floor, s.time_step, s.max_frequency, s.pre_emphasis_from
    )
    return cepstrogram_cpps(values, x1, dx, domain, qmax, s)


def praat_cpps_db(snd: parselmouth.Sound, settings: CPPSSettings = CPPSSettings()) -> float:
    """CPPS (dB) of the whole sound by Praat's own "Get CPPS" (the reference that
    cepstrogram_cpps is checked against)."""
    s = settings
    pc = call(snd, "To PowerCepstrogram", s.pitch_floor, s.time_step, s.max_frequency, s.pre_emphasis_from)
    return float(
        call(
            pc,
            "Get CPPS",
            False,
            s.time_averaging_window,
            s.quefrency_averaging_window,
            s.peak_search_min_f0,
            s.peak_search_max_f0,
            s.tolerance,
            "Parabolic",
            0.001,
            0,
            "Straight",
            "Robust",
        )
    )


def hnr_db(snd: parselmouth.Sound, times: np.ndarray, time_step: float, pitch_floor: float) -> float:
    """Harmonics-to-noise ratio (dB): Praat's cross-correlation harmonicity (silence
    threshold 0.1, one period per window; voicebias.instruments.harmonicity), median
    over the frames nearest the given voiced frame times (frames Praat marks -200 dB,
    voiceless, are left out)."""
    from voicebias.instruments.harmonicity import harmonicity_at

    v = harmonicity_at(snd, times, time_step, pitch_floor, 0.1, 1.0)
    v = v[v > -200]
    return float(np.median(v)) if v.size else float("nan")
