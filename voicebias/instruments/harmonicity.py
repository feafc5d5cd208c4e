"""HNR (component 'hnr' of the measure set): the median over voiced frames of the harmonics-to-noise
ratio (dB) by forward cross-correlation, as Praat 6.1.38's "To Harmonicity (cc)" defines it
(Boersma, 1993), computed only at the frames asked for.

Each frame's HNR, 10 log10(r / (1 - r)), is taken at its strongest sinc-refined correlation peak r,
or is -200 dB when the voiceless candidate is at least as strong. Checked frame by frame against
Praat's own analysis (tests/unit/instruments/test_harmonicity.py); sounds the analysis cannot take
as a whole are handed to Praat itself.

The per-frame method: docs/instrument.md, "HNR".
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
import parselmouth
from parselmouth.praat import call

from voicebias.instruments.jit import kernel

#: the measures this component gives (voicebias.contract.MEASURE_COLUMNS)
MEASURES = ("hnr_db",)

SINC_DEPTH = 700
CHEB_N = 24
SCREEN_STEPS = 8
SCREEN_MARGIN = 0.05
# Correlations closer than this are taken as equal when looking for maxima: on flat
# stretches (a frame of digital silence after mean removal) their order is rounding.
FLAT = 1e-12
_CORRELATION_CHUNK = 1 << 17  # values per batch of frames correlated at once
_GOLDEN = 1.0 - 0.6180339887498948482045868343656381177203
_SQRT_EPS = math.sqrt(2.0**-53)
_NODES = 0.5 + 0.5 * np.cos(np.pi * (np.arange(CHEB_N) + 0.5) / CHEB_N)  # Chebyshev nodes on (0, 1)
_TO_COEF = (2.0 / CHEB_N) * np.cos(np.pi * np.outer(np.arange(CHEB_N), np.arange(CHEB_N) + 0.5) / CHEB_N)
_TO_COEF[0] *= 0.5


def interpolation_weights(n: int, x: np.ndarray) -> tuple[int, np.ndarray]:
    """Praat's depth-700 value interpolation of an n-point array (1-based positions) at
    non-integer positions x that share one floor m, as weights on the array's points.

    The depth is cut to the points available on either side of m (nearest, linear and
    cubic where none, one or two remain); from three on it is a sinc whose raised-cosine
    window spans, on each side, the distance from x to one point past the last tap.
    Returns (first 1-based index, weights of shape (len(x), taps))."""
    x = np.atleast_1d(np.asarray(x, dtype=float))
    m = int(np.floor(x[0]))
    depth = min(SINC_DEPTH, m, n - m)
    if depth <= 0:
        raise ValueError(f"position {x[0]} is outside the array of {n} points")
    phase = x - m
    if depth == 1:
        return m, np.stack([1.0 - phase, phase], axis=1)
    if depth == 2:
        # Hermite-like cubic through y[m], y[m+1] with central-difference slopes,
        # written as weights on y[m-1], y[m], y[m+1], y[m+2]
        c, g = phase * (1.0 - phase), phase - 0.5
        return m - 1, np.stack(
            [
                -c * (0.25 - 0.5 * g),
                (1.0 - phase) - c * (-0.25 + 1.5 * g),
                phase - c * (-0.25 - 1.5 * g),
                -c * (0.25 + 0.5 * g),
            ],
            axis=1,
        )
    left, right = m + 1 - depth, m + depth
    taps = np.arange(left, right + 1)
    dist = x[:, None] - taps[None, :]
    span = np.where(dist > 0, (x - left + 1.0)[:, None], (right - x + 1.0)[:, None])
    a = np.pi * np.abs(dist)
    return left, np.sin(a) / a * 0.5 * (1.0 + np.cos(a / span))


def _coefficient_weights(n: int, m: int) -> tuple[int, np.ndarray]:
    """Weights that turn the array's points into the Chebyshev coefficients of its
    interpolation on (m, m + 1): (first index, (taps, CHEB_N)). The product with the
    node-to-coefficient matrix is summed node by node in order (not by BLAS, whose
    order depends on the processor)."""
    left, w = interpolation_weights(n, m + _NODES)
    return left, _node_sums(w, _TO_COEF)


@kernel
def _node_sums(w, to_coef):  # pragma: no cover - compiled
    """out[t, j] = sum_k to_coef[j, k] w[k, t], summed in order of k."""
    out = np.empty((w.shape[1], to_coef.shape[0]))
    for t in range(w.shape[1]):
        for j in range(to_coef.shape[0]):
            acc = 0.0
            for k in range(w.shape[0]):
                acc += w[k, t] * to_coef[j, k]
            out[t, j] = acc
    return out


@lru_cache(maxsize=16384)
def _grid_weights(n: int, m: int) -> tuple[int, np.ndarray]:
    """Weights that give the interpolation at the SCREEN_STEPS - 1 inner points of a
    grid on (m, m + 1): (first index, (taps, SCREEN_STEPS - 1))."""
    left, w = interpolation_weights(n, m + np.arange(1, SCREEN_STEPS) / SCREEN_STEPS)
    return left, np.ascontiguousarray(w.T)


class _Pieces:
    """The weights of every piece (m, m + 1) of an n-point array for one evaluation
    (`weights`, e.g. _coefficient_weights), packed for `_apply_pieces`:
    computed the first time a piece is asked for, then kept for the process."""

    def __init__(self, n: int, weights) -> None:
        self.n, self.weights = n, weights
        m = np.arange(n + 1)
        room = np.maximum(4, 2 * np.minimum(SINC_DEPTH, np.minimum(m, n - m)))  # taps a piece can have
        self.offset = np.concatenate([[0], np.cumsum(room)[:-1]]).astype(np.int64)
        self.first = np.zeros(n + 1, dtype=np.int64)
        self.taps = np.zeros(n + 1, dtype=np.int64)
        self.width = weights(n, n // 2)[1].shape[1]
        self.flat = np.zeros((int(room.sum()), -(-self.width // 8) * 8))  # columns padded to eights
        self.ready = np.zeros(n + 1, dtype=bool)

    def apply(self, r: np.ndarray, rows: np.ndarray, ms: np.ndarray) -> np.ndarray:
        """The weights of piece ms[i] applied to row rows[i] of r, for every i."""
        for m in np.unique(ms[~self.ready[ms]]).tolist():
            left, w = self.weights(self.n, m)
            self.first[m], self.taps[m] = left, len(w)
            self.flat[self.offset[m] : self.offset[m] + len(w), : self.width] = w
            self.ready[m] = True
        out = np.empty((len(rows), self.width))
        _apply_pieces(r, rows.astype(np.int64), ms.astype(np.int64), self.first, self.offset, self.taps, self.flat, out)
        return out


@lru_cache(maxsize=64)
def _pieces(n: int, weights) -> _Pieces:
    return _Pieces(n, weights)


def _screen(r: np.ndarray, rows: np.ndarray, ms: np.ndarray) -> np.ndarray:
    """The interpolation at the grid points of piece ms[i] of row rows[i] of r, for the
    screening: the rows of each piece as one matrix product (BLAS: its last bits may
    differ between processors, which can only matter to a candidate whose screened
    value lies within rounding of the screening margin)."""
    out = np.empty((len(rows), SCREEN_STEPS - 1))
    order = np.argsort(ms, kind="stable")
    pieces, starts = np.unique(ms[order], return_index=True)
    for m, lo, hi in zip(pieces.tolist(), starts.tolist(), [*starts[1:].tolist(), len(order)]):
        sel = order[lo:hi]
        left, w = _grid_weights(r.shape[1], m)
        out[sel] = r[rows[sel], left - 1 : left - 1 + w.shape[0]] @ w
    return out


@kernel
def _apply_pieces(r, rows, ms, first, offset, taps, flat, out):  # pragma: no cover - compiled
    """out[i, c] = sum_t r[rows[i], first[m] - 1 + t] flat[offset[m] + t, c], m = ms[i],
    over the taps of piece m in order, eight columns c at a time (flat has a multiple of
    eight columns; out as many as it needs)."""
    for i in range(rows.shape[0]):
        m = ms[i]
        row, base, o = r[rows[i]], first[m] - 1, offset[m]
        for c in range(0, flat.shape[1], 8):
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
            for t in range(taps[m]):
                v, w = row[base + t], flat[o + t]
                a0 += v * w[c]
                a1 += v * w[c + 1]
                a2 += v * w[c + 2]
                a3 += v * w[c + 3]
                a4 += v * w[c + 4]
                a5 += v * w[c + 5]
                a6 += v * w[c + 6]
                a7 += v * w[c + 7]
            sums = (a0, a1, a2, a3, a4, a5, a6, a7)
            for k in range(min(8, out.shape[1] - c)):
                out[i, c + k] = sums[k]


@kernel
def _chebyshev(coef, u):  # pragma: no cover - compiled
    """sum_j coef[j] T_j(u) by Clenshaw's recurrence."""
    b1, b2 = 0.0, 0.0
    for j in range(coef.shape[0] - 1, 0, -1):
        b1, b2 = 2.0 * u * b1 - b2 + coef[j], b1
    return u * b1 - b2 + coef[0]


@kernel
def _negative(r_row, coef, pos, x):  # pragma: no cover - compiled
    """Minus the interpolated correlation at x (1-based position) on the piece
    (pos - 1, pos) or (pos, pos + 1) it lies in; the sample itself at whole x."""
    m = math.floor(x)
    if x == m:
        return -r_row[int(m) - 1]
    piece = min(max(int(m) - (pos - 1), 0), 1)
    return -_chebyshev(coef[piece], 2.0 * (x - m) - 1.0)


@kernel
def _brent(r, rows, pos, coef, tol, max_iter, peak, at):  # pragma: no cover - compiled
    """Maximum of the interpolated correlation of each candidate i (row rows[i] of r,
    Chebyshev pieces coef[i] on either side of its lag pos[i]) over pos +- 1: Brent's
    minimisation of its negative with the golden-section start, parabolic steps, step
    floor and stopping rule of Praat's NUMminimize_brent. (maximum, position) into
    peak, at."""
    for i in range(rows.shape[0]):
        row, p = r[rows[i]], pos[i]
        a, b = p - 1.0, p + 1.0
        v = a + _GOLDEN * (b - a)
        fv = _negative(row, coef[i], p, v)
        x, w, fx, fw = v, v, fv, fv
        for _ in range(max_iter):
            mid = 0.5 * (a + b)
            tol_act = _SQRT_EPS * abs(x) + tol / 3.0
            if not abs(x - mid) + (b - a) / 2.0 > 2.0 * tol_act:
                break
            step = _GOLDEN * (b - x if x < mid else a - x)
            t1 = (x - w) * (fx - fv)
            q = (x - v) * (fx - fw)
            pp = (x - v) * q - (x - w) * t1
            q = 2.0 * (q - t1)
            if q > 0.0:
                pp = -pp
            q = abs(q)
            if (
                abs(x - w) >= tol_act
                and abs(pp) < abs(step * q)
                and pp > q * (a - x + 2.0 * tol_act)
                and pp < q * (b - x - 2.0 * tol_act)
            ):
                step = pp / q
            if abs(step) < tol_act:
                step = tol_act if step > 0.0 else -tol_act
            t = x + step
            ft = _negative(row, coef[i], p, t)
            if ft <= fx:
                if t < x:
                    b = x
                else:
                    a = x
                v, fv, w, fw, x, fx = w, fw, x, fx, t, ft
            else:
                if t < x:
                    a = t
                else:
                    b = t
                if ft <= fw or w == x:
                    v, fv, w, fw = w, fw, t, ft
                elif ft <= fv or v == x or v == w:
                    v, fv = t, ft
        peak[i], at[i] = -fx, x


def _refine(
    r: np.ndarray, rows: np.ndarray, pos: np.ndarray, tol: float = 1e-10, max_iter: int = 60
) -> tuple[np.ndarray, np.ndarray]:
    """Maximum of the interpolated correlation rows r[rows] over pos +- 1 (1-based
    positions), by `_brent` on the Chebyshev expansions of the two unit intervals
    around each. Returns (maximum, position)."""
    pieces = _pieces(r.shape[1], _coefficient_weights)
    coef = np.stack([pieces.apply(r, rows, pos - 1), pieces.apply(r, rows, pos)], axis=1)
    peak, at = np.empty(len(rows)), np.empty(len(rows))
    _brent(
        np.ascontiguousarray(r), rows.astype(np.int64), pos.astype(np.int64), coef, float(tol), int(max_iter), peak, at
    )
    return peak, at


@kernel
def _normalised_correlation(seg, product, width, max_lag, r):  # pragma: no cover - compiled
    """Per frame (rows of seg, the frame's samples minus their local mean, and product,
    the cross-products of its first `width` samples with the samples k later): the
    normalised correlation product[k] / sqrt(e(0) e(k)), e(k) the energy of the width
    samples from k on, at lags k = 1..max_lag (lag 0 is 1), written into r at
    width + k and, mirrored, at width - k."""
    sq = np.empty(seg.shape[1] + 1)
    for f in range(seg.shape[0]):
        sq[0] = 0.0
        for j in range(seg.shape[1]):  # running energy, summed in order
            sq[j + 1] = sq[j] + seg[f, j] * seg[f, j]
        r[f, width] = 1.0
        for k in range(1, max_lag + 1):
            v = product[f, k] / math.sqrt(sq[width] * (sq[k + width] - sq[k]))
            r[f, width + k] = v
            r[f, width - k] = v


@kernel
def _local_maxima(r, width, max_lag):  # pragma: no cover - compiled
    """The candidates: every lag k, 2 <= k < min(max_lag, width), at which the
    correlation (r at width + k) is positive and a local maximum (above its left
    neighbour by FLAT, not below its right one by FLAT); (frame rows, 1-based positions
    k + width + 1), frame by frame in order of lag."""
    top = min(max_lag, width)
    count = 0
    for f in range(r.shape[0]):
        for k in range(2, top):
            mid = r[f, width + k]
            if mid > 0.0 and mid > r[f, width + k - 1] + FLAT and mid >= r[f, width + k + 1] - FLAT:
                count += 1
    rows, pos = np.empty(count, dtype=np.int64), np.empty(count, dtype=np.int64)
    i = 0
    for f in range(r.shape[0]):
        for k in range(2, top):
            mid = r[f, width + k]
            if mid > 0.0 and mid > r[f, width + k - 1] + FLAT and mid >= r[f, width + k + 1] - FLAT:
                rows[i], pos[i] = f, k + width + 1
                i += 1
    return rows, pos


def praat_harmonicity(
    snd: parselmouth.Sound,
    time_step: float,
    pitch_floor: float,
    silence_threshold: float = 0.1,
    periods_per_window: float = 1.0,
) -> parselmouth.Harmonicity:
    """Praat's own "To Harmonicity (cc)" (the reference this module is checked against)."""
    return call(snd, "To Harmonicity (cc)", time_step, pitch_floor, silence_threshold, periods_per_window)


def harmonicity_at(
    snd: parselmouth.Sound,
    times: np.ndarray,
    time_step: float,
    pitch_floor: float,
    silence_threshold: float = 0.1,
    periods_per_window: float = 1.0,
) -> np.ndarray:
    """HNR (dB; -200 where the frame is voiceless) of the harmonicity frame nearest each
    of `times` (s), as Praat's "To Harmonicity (cc)" with these arguments gives it."""
    times = np.asarray(times, dtype=float)
    z = np.asarray(snd.values[0], dtype=np.float64)
    nx, dx, x1 = len(z), float(snd.dx), float(snd.x1)
    duration = dx * nx
    n_period = math.floor(1.0 / dx / pitch_floor)
    half_period = n_period // 2 + 1
    window_s = periods_per_window / pitch_floor
    half_window = math.floor(window_s / dx) // 2 - 1
    width = 2 * half_window
    max_lag = min(math.floor(width / periods_per_window) + 2, width)
    frame_s = 1.0 / pitch_floor + window_s
    if frame_s > duration or half_window < 2 or pitch_floor < periods_per_window / duration:
        return _from_praat(snd, times, time_step, pitch_floor, silence_threshold, periods_per_window)
    n_frames = math.floor((duration - frame_s) / time_step) + 1
    t1 = x1 - 0.5 * dx + 0.5 * duration - 0.5 * n_frames * time_step + 0.5 * time_step
    nearest = np.clip(np.round((times - t1) / time_step).astype(int), 0, n_frames - 1)
    frames = np.unique(nearest)
    t = t1 + frames * time_step
    centre = np.floor((t - x1) / dx + 1.0).astype(int)  # 1-based sample left of the centre
    csum = np.concatenate([[0.0], np.cumsum(z)])
    local_mean = (csum[centre + n_period] - csum[centre + 1 - n_period - 1]) / (2 * n_period)
    lo, hi = max(1, half_window + 1 - half_period), min(width, half_window + half_period)
    near = z[(centre - half_window)[:, None] + np.arange(lo - 1, hi)[None, :]] - local_mean[:, None]
    local_peak = np.max(np.abs(near), axis=1)
    global_peak = float(np.max(np.abs(z - np.mean(z))))
    if global_peak == 0.0:
        return np.full(len(times), -200.0)
    intensity = np.minimum(local_peak / global_peak, 1.0)
    start = np.maximum(np.floor((t - 0.5 * frame_s - x1) / dx + 1.0).astype(int), 1)
    span = max_lag + width
    if np.any(start - 1 + span > nx):
        return _from_praat(snd, times, time_step, pitch_floor, silence_threshold, periods_per_window)
    nfft = 1 << (span + width - 2).bit_length()  # the smallest power of two >= span + width - 1
    # the symmetric correlation over lags -width..width, 1-based: lag k at k + width + 1
    n = 2 * width + 1
    r = np.full((len(t), n), np.nan)
    step = max(1, _CORRELATION_CHUNK // nfft)  # frames at a time, so the spectra stay in cache
    for lo in range(0, len(t), step):
        part = slice(lo, lo + step)
        seg = z[(start[part] - 1)[:, None] + np.arange(span)[None, :]] - local_mean[part, None]
        product = np.fft.irfft(np.conj(np.fft.rfft(seg[:, :width], nfft)) * np.fft.rfft(seg, nfft), nfft)
        _normalised_correlation(seg, product, width, max_lag, r[part])
    max_candidates = max(15, math.floor(0.5 / dx / pitch_floor))
    rows, pos = _local_maxima(r, width, max_lag)
    if len(rows) and np.max(np.bincount(rows)) > max_candidates - 1:
        return _from_praat(snd, times, time_step, pitch_floor, silence_threshold, periods_per_window)
    # screen: the integer points and a grid inside each neighbouring unit interval
    grid = np.concatenate(
        [
            r[rows, pos - 2][:, None],
            r[rows, pos - 1][:, None],
            r[rows, pos][:, None],
            _screen(r, rows, pos - 1),
            _screen(r, rows, pos),
        ],
        axis=1,
    )
    coarse = np.max(np.where(np.isfinite(grid), grid, -np.inf), axis=1)
    reflected = np.where(coarse > 1.0, 1.0 / coarse, coarse)
    best = np.full(len(t), -np.inf)
    np.maximum.at(best, rows, reflected)
    keep = (reflected >= best[rows] - SCREEN_MARGIN) | (coarse > 1.0 - SCREEN_MARGIN)
    rows, pos = rows[keep], pos[keep]
    peak, at = _refine(r, rows, pos)
    strength = np.where(peak > 1.0, 1.0 / peak, peak)
    # a maximum at or below lag 2 lies at or above the Nyquist ceiling: voiceless
    strength = np.where(at - width - 1 > 2.0, strength, -np.inf)
    top = np.full(len(t), -np.inf)
    np.maximum.at(top, rows, strength)
    voiceless = np.maximum(0.0, 2.0 - intensity / silence_threshold)
    with np.errstate(divide="ignore", invalid="ignore"):
        db = np.where(top <= 1e-15, -150.0, np.where(top > 1.0 - 1e-15, 150.0, 10.0 * np.log10(top / (1.0 - top))))
    db = np.where((top > voiceless) & (local_peak > 0.0), db, -200.0)
    by_frame = np.empty(n_frames)
    by_frame[frames] = db
    return by_frame[nearest]


def _from_praat(snd, times, time_step, pitch_floor, silence_threshold, periods_per_window) -> np.ndarray:
    harm = praat_harmonicity(snd, time_step, pitch_floor, silence_threshold, periods_per_window)
    idx = np.clip(np.round((np.asarray(times) - harm.x1) / harm.dx).astype(int), 0, harm.nx - 1)
    return harm.values[0][idx]


def hnr_db(snd: parselmouth.Sound, times: np.ndarray, time_step: float, pitch_floor: float) -> float:
    """Harmonics-to-noise ratio (dB): Praat's cross-correlation harmonicity (silence
    threshold 0.1, one period per window; voicebias.instruments.harmonicity), median
    over the frames nearest the given voiced frame times (frames Praat marks -200 dB,
    voiceless, are left out)."""
    v = harmonicity_at(snd, times, time_step, pitch_floor, 0.1, 1.0)
    v = v[v > -200]
    return float(np.median(v)) if v.size else float("nan")


def measure(a: Any) -> dict[str, float]:
    """HNR at the voiced frames of the analysed signal `a` (voicebias.instruments.acoustics' shared analysis)."""
    _, _, times, _ = a.pitch()
    return {"hnr_db": hnr_db(a.snd, times, a.s.time_step, a.s.pitch_floor)}
