"""CPPS (component 'cpps' of the measure set): smoothed cepstral peak prominence (dB), Praat's "Get CPPS" on a
PowerCepstrogram of the voiced stretches only (pauses would lower it), with the
argument lists of Praat 6.1.38 as bundled in parselmouth 0.4.7. The cepstrogram is
Praat's algorithm re-expressed by voicebias.instruments.cepstrum; its "Get CPPS"
(smoothing, trend line, peak search, mean over frames) is evaluated here by
`cepstrogram_cpps`, a few frames at a time in compiled loops
(voicebias.instruments.jit), following Praat 6.1.38's definition step by step; it
agrees with Praat to 1e-12 dB (tests/unit/instruments/test_voice_quality.py) at a
fraction of its cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import parselmouth
from parselmouth.praat import call

from voicebias.instruments.jit import kernel

#: the measures this component gives (voicebias.contract.MEASURE_COLUMNS)
MEASURES = ("cpps_db",)


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


def measure(a: Any) -> dict[str, float]:
    """CPPS of the voiced stretches of the analysed signal `a` (voicebias.instruments.acoustics' shared analysis)."""
    xs, voiced, _, _ = a.pitch()
    intervals = voiced_intervals(xs, voiced, a.s.time_step)
    return {"cpps_db": cpps_db(a.snd, intervals, CPPSSettings(time_step=a.s.cpps_time_step))}
