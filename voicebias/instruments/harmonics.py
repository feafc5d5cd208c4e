"""Harmonic levels (component 'harmonics' of the measure set): H1-H2 and H1-A3, uncorrected and
Iseli-corrected (dB).

Levels follow PraatSauce: per voiced frame a Hann-windowed spectrum `n_periods` pitch periods
long, H1 and H2 the peaks near f0 and 2 f0, A3 the peak near F3 (the formant track of
voicebias.instruments.formants). Corrected levels remove each formant's boost at the harmonic
(Iseli, Shue & Alwan, 2007), with Hawks & Miller (1995) bandwidths by default
(`bandwidths="measured"` takes those of the formant analysis). Medians over voiced frames.

The method and the correction's equation: docs/instrument.md, "Harmonic levels: H1-H2 and H1-A3".
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from voicebias.instruments.frames import FFT_CHUNK, windowed_frames
from voicebias.instruments.jit import kernel

#: the measures this component gives (voicebias.contract.MEASURE_COLUMNS)
MEASURES = ("h1_h2_db", "h1_h2_corrected_db", "h1_a3_db", "h1_a3_corrected_db")


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
            windowed_frames(x, start[rows[part]], hann, which[part].astype(np.int64), lengths, frames)
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


def measure(a: Any) -> dict[str, float]:
    """The harmonic-level measures of the analysed signal `a` (voicebias.instruments.acoustics' shared
    analysis): medians over the voiced frames where each is defined."""
    _, _, times, f0_voiced = a.pitch()
    tracks, bandwidths = a.formants()
    harmonics = harmonic_levels(a.x, a.sr, times, f0_voiced, tracks, bandwidths)

    def med(col: str) -> float:
        v = harmonics[col].to_numpy(float)
        v = v[np.isfinite(v)]
        return float(np.median(v)) if v.size else float("nan")

    return {c: med(c) for c in MEASURES}
