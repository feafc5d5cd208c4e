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
VoiceSauce, H1 and H2 are corrected for F1 and F2, A3 for F1, F2 and F3. Per-frame values are summarised by their median over voiced
frames.

CPPS (smoothed cepstral peak prominence, dB) is Praat's "Get CPPS" on a
PowerCepstrogram of the voiced stretches only (pauses would lower it), with the
argument lists of Praat 6.1.38 as bundled in parselmouth 0.4.7. Praat computes the
cepstrogram; its "Get CPPS" (smoothing, trend line, peak search, mean over frames) is
evaluated here on whole arrays by `cepstrogram_cpps`, which follows Praat 6.1.38's
definition step by step and agrees with Praat to 1e-12 dB (tests/unit/instruments/
test_voice_quality.py) at a fraction of its cost. HNR (dB) is
Praat's cross-correlation harmonicity, median over voiced frames, computed at those
frames only by voicebias.instruments.harmonicity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import parselmouth
from parselmouth.praat import call
from scipy import sparse


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
    num = (1 - 2 * r * np.cos(wi) + r ** 2) ** 2
    den = (1 - 2 * r * np.cos(w + wi) + r ** 2) * (1 - 2 * r * np.cos(w - wi) + r ** 2)
    return 10.0 * np.log10(num / den)


# Hawks & Miller (1995), eq. 1: bandwidth (Hz) as a 5th-order polynomial of the formant
# frequency, one set of coefficients below 500 Hz and one above, scaled by f0.
_HM_LOW = (165.327516, -6.73636734e-1, 1.80874446e-3, -4.52201682e-6, 7.49514000e-9, -4.70219241e-12)
_HM_HIGH = (15.8146139, 8.10159009e-2, -9.79728215e-5, 5.28725064e-8, -1.07099364e-11, 7.91528509e-16)


def hawks_miller_bandwidth(formant_hz, f0_hz) -> np.ndarray:
    """Formant bandwidth (Hz) predicted from formant frequency and f0 (Hz), Hawks & Miller (1995)."""
    F = np.asarray(formant_hz, dtype=float)
    scale = 1.0 + 0.25 * (np.asarray(f0_hz, dtype=float) - 132.0) / 88.0
    low = sum(c * F ** k for k, c in enumerate(_HM_LOW))
    high = sum(c * F ** k for k, c in enumerate(_HM_HIGH))
    return scale * np.where(F < 500.0, low, high)


def _peak_levels(freqs: np.ndarray, spec: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of the complex spectra `spec` (frames, bins, on the bin frequencies
    `freqs` in Hz): the highest level 20 log10 |spec| (dB, floored at -240) in [lo, hi]
    Hz and its frequency (Hz), parabolic-interpolated (the first bin of a tie; the bin
    itself at the spectrum's edges). Levels are computed only at the bins searched and
    their neighbours. NaN where the range holds no bin or a bound is NaN."""
    n_bins = spec.shape[1]

    def level(rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        return 20 * np.log10(np.maximum(np.abs(spec[rows, cols]), 1e-12))

    finite = np.isfinite(lo) & np.isfinite(hi)
    i0 = np.searchsorted(freqs, np.where(finite, lo, 0.0))
    i1 = np.searchsorted(freqs, np.where(finite, hi, 0.0), side="right")
    empty = ~finite | (i1 - i0 < 1)
    width = int(max(1, np.max(np.where(empty, 1, i1 - i0))))
    idx = i0[:, None] + np.arange(width)[None, :]
    rows = np.arange(len(spec))[:, None]
    cand = np.where(idx < i1[:, None], level(rows, np.minimum(idx, n_bins - 1)), -np.inf)
    k = np.minimum(i0 + np.argmax(cand, axis=1), n_bins - 1)
    r = np.arange(len(spec))
    inner = (k > 0) & (k < n_bins - 1)
    a = level(r, np.maximum(k - 1, 0))
    b = level(r, k)
    c = level(r, np.minimum(k + 1, n_bins - 1))
    denom = a - 2 * b + c
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(inner & (denom < 0), 0.5 * (a - c) / np.where(denom < 0, denom, -1.0), 0.0)
    peak = np.where(inner, b - 0.25 * (a - c) * p, b)
    at = freqs[k] + p * (freqs[1] - freqs[0])
    return np.where(empty, np.nan, peak), np.where(empty, np.nan, at)


def harmonic_levels(
    x: np.ndarray, sr: int, times: np.ndarray, f0: np.ndarray, formants: np.ndarray,
    bandwidths: np.ndarray | None = None, n_periods: float = 6.0,
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

    The frames are analysed together: frames that share an FFT length (a power of two
    at least eight times the window) are windowed into one zero-padded array and
    transformed at once, and the peak searches and corrections run on whole arrays.
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
    nfft = np.array([1 << int(np.ceil(np.log2(8 * m))) for m in n[keep]], dtype=int)
    for size in np.unique(nfft):
        sel = np.flatnonzero(nfft == size)
        rows = keep[sel]
        lengths, which = np.unique(n[rows], return_inverse=True)
        j = np.arange(int(lengths.max()))[None, :]
        hann = np.zeros((len(lengths), j.shape[1]))   # a Hann window of each frame length, zeros after it
        for i, m in enumerate(lengths):
            hann[i, :m] = np.hanning(m)
        frames = x[np.minimum(start[rows][:, None] + j, len(x) - 1)] * hann[which]
        freqs = np.fft.rfftfreq(int(size), 1.0 / sr)
        f, fm, bw = f0[rows], formants[rows], bandwidths[rows]
        # levels only up to the bin past the highest band searched (A3's, else H2's)
        top = np.nanmax(np.concatenate([2.1 * f, 1.1 * fm[:, 2]]))
        last = min(len(freqs), int(np.searchsorted(freqs, top, side="right")) + 2)
        spec = np.fft.rfft(frames, int(size), axis=1)[:, :last]
        freqs = freqs[:last]
        h1, fh1 = _peak_levels(freqs, spec, 0.9 * f, 1.1 * f)
        h2, fh2 = _peak_levels(freqs, spec, 1.9 * f, 2.1 * f)
        a3, fa3 = _peak_levels(freqs, spec, 0.9 * fm[:, 2], 1.1 * fm[:, 2])

        def c12(fr: np.ndarray) -> np.ndarray:
            return iseli_correction_db(fr, fm[:, 0], bw[:, 0], sr) + iseli_correction_db(fr, fm[:, 1], bw[:, 1], sr)

        with np.errstate(invalid="ignore", divide="ignore"):
            vals = {"h1_db": h1, "h2_db": h2, "a3_db": a3, "a3_hz": fa3, "h1c_db": h1 - c12(fh1),
                    "h2c_db": h2 - c12(fh2), "a3c_db": a3 - c12(fa3) - iseli_correction_db(fa3, fm[:, 2], bw[:, 2], sr)}
        for c, v in vals.items():
            out[c][sel] = v
    df = pd.DataFrame(out, columns=columns)
    df["h1_h2_db"] = df["h1_db"] - df["h2_db"]
    df["h1_a3_db"] = df["h1_db"] - df["a3_db"]
    df["h1_h2_corrected_db"] = df["h1c_db"] - df["h2c_db"]
    df["h1_a3_corrected_db"] = df["h1c_db"] - df["a3c_db"]
    return df


def voiced_intervals(times: np.ndarray, voiced: np.ndarray, time_step: float, min_duration: float = 0.0) -> list[tuple[float, float]]:
    """(start, end) in seconds of runs of voiced frames, each frame covering +- time_step/2."""
    out: list[tuple[float, float]] = []
    start = None
    for t, v in zip(times, voiced):
        if v and start is None:
            start = t
        if not v and start is not None:
            out.append((start - time_step / 2, prev + time_step / 2))
            start = None
        prev = t
    if start is not None:
        out.append((start - time_step / 2, prev + time_step / 2))
    return [(a, b) for a, b in out if b - a >= min_duration]


def _window_mean_weights(n: int, x1: float, dx: float, domain: tuple[float, float], mids: np.ndarray,
                         half: float) -> tuple[np.ndarray, np.ndarray]:
    """Praat's mean of a sampled function over [mid - half, mid + half] (Sampled_getMean
    with linear interpolation: the area under the piecewise-linear curve through the
    samples x1 + i dx, i = 0..n-1, divided by the length it covers, both clipped to
    `domain`), written as weights: mean_k = sum_j weights[k, j] v[first[k] + j].
    Every sample value must be defined. Returns (first, weights)."""
    lo = np.maximum(mids - half, domain[0])
    hi = np.minimum(mids + half, domain[1])
    imin = np.maximum(np.ceil((lo - x1) / dx), 0).astype(int)   # first sample centre inside
    imax = np.minimum(np.floor((hi - x1) / dx), n - 1).astype(int)   # last one
    if np.any(imin > imax):
        raise ValueError("an averaging window holds no sample centre")
    inside = imax - imin + 1
    cols = np.arange(int(inside.max()) + 2)[None, :]
    w = ((cols >= 1) & (cols <= inside[:, None])).astype(float)   # column 0 is sample imin - 1
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
            (hi < right_edge, (hi - (x1 + imax * dx)) / dx, inside, inside + 1, imax + 1 <= n - 1)):
        phase = np.where(has_out, phase, np.minimum(phase, 0.5))
        w[rows, j] += np.where(end, -0.5 + np.where(has_out, phase - 0.5 * phase * phase, phase), 0.0)
        w[rows, j_out] += np.where(end & has_out, 0.5 * phase * phase, 0.0)
        cover += np.where(end, phase - 0.5, 0.0)
    return imin - 1, w / cover[:, None]


def _apply_window_mean(v: np.ndarray, axis: int, first: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """sum_j weights[k, j] v[first[k] + j] along `axis` of a 2-D array, as one sparse
    banded matrix product (indices outside the axis are left out)."""
    v = np.asarray(v, dtype=np.float64)
    n = v.shape[axis]
    cols = first[:, None] + np.arange(weights.shape[1])[None, :]
    ok = (cols >= 0) & (cols < n) & (weights != 0.0)
    rows = np.broadcast_to(np.arange(len(first))[:, None], cols.shape)
    band = sparse.csr_matrix((weights[ok], (rows[ok], cols[ok])), shape=(len(first), n))
    return np.asarray(band @ v) if axis == 0 else np.asarray(band @ v.T).T


def _median_rows(a: np.ndarray) -> np.ndarray:
    """Median of each row (the mean of the two middle values for an even count)."""
    n = a.shape[1]
    k = n // 2
    if n % 2:
        return np.partition(a, k, axis=1)[:, k]
    part = np.partition(a, (k - 1, k), axis=1)
    return 0.5 * (part[:, k - 1] + part[:, k])


def cepstrogram_cpps(power: np.ndarray, x1: float, dx: float, domain: tuple[float, float], qmax: float,
                     settings: CPPSSettings = CPPSSettings()) -> float:
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
    z = np.ascontiguousarray(np.asarray(power, dtype=np.float64).T)   # (frames, quefrencies)
    if np.floor(s.time_averaging_window / dx) > 1:
        first, w = _window_mean_weights(nx, x1, dx, domain, x1 + np.arange(nx) * dx, 0.5 * s.time_averaging_window)
        z = _apply_window_mean(z, 0, first, w)
    if s.quefrency_averaging_window / dq > 1.0:
        first, w = _window_mean_weights(nq, 0.0, dq, (0.0, qmax), np.arange(nq) * dq,
                                        0.5 * s.quefrency_averaging_window)
        z = _apply_window_mean(z, 1, first, w)
    level = 10.0 * np.log10(z + 1e-30)
    q = np.arange(nq) * dq
    half = nq // 2
    second = half + nq % 2
    slope = _median_rows((level[:, second:second + half] - level[:, :half]) / (q[second:second + half] - q[:half]))
    intercept = _median_rows(level - slope[:, None] * q[None, :])
    q_lo, q_hi = 1.0 / s.peak_search_max_f0, 1.0 / s.peak_search_min_f0
    i_lo = max(int(np.ceil(q_lo / dq)), 0)
    i_hi = min(int(np.floor(q_hi / dq)), nq - 1)
    rows = np.arange(nx)
    peak = np.maximum(level[:, i_lo], level[:, i_hi])
    at = np.where(level[:, i_hi] > level[:, i_lo], float(i_hi), float(i_lo))
    i = np.arange(max(i_lo, 1), min(i_hi, nq - 2) + 1)
    mid, left, right = level[:, i], level[:, i - 1], level[:, i + 1]
    d1 = 0.5 * (right - left)
    d2 = 2.0 * mid - left - right
    with np.errstate(divide="ignore", invalid="ignore"):
        refined = np.where((mid > left) & (mid >= right), mid + 0.5 * d1 * d1 / d2, -np.inf)
        offset = d1 / d2
    best = np.argmax(refined, axis=1)   # the first of equal maxima, as Praat's scan keeps
    higher = refined[rows, best] > peak
    peak = np.where(higher, refined[rows, best], peak)
    at = np.where(higher, i[best] + offset[rows, best], at)
    q_peak = np.clip(at * dq, q_lo, q_hi)
    return float(np.mean(peak - (slope * q_peak + intercept)))


def cpps_db(snd: parselmouth.Sound, intervals: list[tuple[float, float]] | None = None,
            settings: CPPSSettings = CPPSSettings()) -> float:
    """Smoothed cepstral peak prominence (dB) of the sound, or of the given voiced
    intervals (s) joined end to end: Praat's PowerCepstrogram (computed by
    voicebias.instruments.cepstrum.power_cepstrogram), then cepstrogram_cpps."""
    if intervals is not None:
        x, sr = snd.values[0], snd.sampling_frequency
        parts = [x[max(0, int(a * sr)):int(np.ceil(b * sr))] for a, b in intervals]
        parts = [p for p in parts if p.size]
        if not parts:
            return float("nan")
        snd = parselmouth.Sound(np.concatenate(parts), sampling_frequency=sr)
    from voicebias.instruments.cepstrum import power_cepstrogram

    s = settings
    if snd.xmin != 0.0:
        snd = parselmouth.Sound(snd.values[0], sampling_frequency=snd.sampling_frequency)
    values, x1, dx, domain, qmax = power_cepstrogram(snd.values[0], snd.sampling_frequency, s.pitch_floor,
                                                     s.time_step, s.max_frequency, s.pre_emphasis_from)
    return cepstrogram_cpps(values, x1, dx, domain, qmax, s)


def praat_cpps_db(snd: parselmouth.Sound, settings: CPPSSettings = CPPSSettings()) -> float:
    """CPPS (dB) of the whole sound by Praat's own "Get CPPS" (the reference that
    cepstrogram_cpps is checked against)."""
    s = settings
    pc = call(snd, "To PowerCepstrogram", s.pitch_floor, s.time_step, s.max_frequency, s.pre_emphasis_from)
    return float(call(pc, "Get CPPS", False, s.time_averaging_window, s.quefrency_averaging_window,
                      s.peak_search_min_f0, s.peak_search_max_f0, s.tolerance, "Parabolic", 0.001, 0,
                      "Straight", "Robust"))


def hnr_db(snd: parselmouth.Sound, times: np.ndarray, time_step: float, pitch_floor: float) -> float:
    """Harmonics-to-noise ratio (dB): Praat's cross-correlation harmonicity (silence
    threshold 0.1, one period per window; voicebias.instruments.harmonicity), median
    over the frames nearest the given voiced frame times (frames Praat marks -200 dB,
    voiceless, are left out)."""
    from voicebias.instruments.harmonicity import harmonicity_at

    v = harmonicity_at(snd, times, time_step, pitch_floor, 0.1, 1.0)
    v = v[v > -200]
    return float(np.median(v)) if v.size else float("nan")
