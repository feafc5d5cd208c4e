"""Power cepstrogram of a sound, as Praat 6.1.38's "Sound: To PowerCepstrogram" computes
it, following Praat's algorithm step by step: the sound is resampled to twice the maximum
frequency (an FFT low-pass when downsampling, then windowed-sinc interpolation of depth 50;
an FFT doubling when the new rate is exactly twice the old; a plain copy when the rate
already fits), pre-emphasised, and cut into frames of twice three periods of the pitch
floor laid symmetrically over the sound; each frame has its mean removed, is multiplied by
Praat's truncated Gaussian window and zero-padded to a power of two, and its power
cepstrum is the square of the inverse Fourier transform of the natural log of its power
spectrum, both transforms scaled by the sampling steps as in Praat.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from scipy import fft as sfft

from voicebias.instruments.jit import kernel, pairwise_sum

SINC_DEPTH = 50
"""Depth of the sinc interpolation in Praat's resampling (its "precision" argument)."""

_ANTI_TURN_AROUND = 1000  # zeros Praat puts before (and at least after) the sound in its FFT filters
_MAX_PHASES = 2000  # rate ratios with larger denominators are interpolated sample by sample
_CHUNK = 1 << 21  # elements per chunk of samples interpolated one by one
_FRAME_CHUNK = 1 << 17  # elements per chunk of frames (small enough to stay in cache)


def _c_round(v: float) -> int:
    """C's round() for v >= 0 (halves away from zero)."""
    r = math.floor(v)
    return int(r + 1 if v - r >= 0.5 else r)


def _padded_spectrum(x: np.ndarray) -> tuple[np.ndarray, int]:
    """The spectrum (numpy's rfft layout) of the sound placed after 1000 zeros in a zero
    buffer whose length is the first power of two that holds it with 1000 zeros on
    either side, as Praat's FFT filters lay it out; and that length."""
    nfft = 1
    while nfft < x.size + 2 * _ANTI_TURN_AROUND:
        nfft *= 2
    buf = np.zeros(nfft)
    buf[_ANTI_TURN_AROUND : _ANTI_TURN_AROUND + x.size] = x
    return sfft.rfft(buf), nfft


def _fft_lowpass(x: np.ndarray, upfactor: float) -> np.ndarray:
    """Praat's anti-aliasing filter before downsampling by `upfactor` (< 1).

    The sound is placed after 1000 zeros in a zero buffer whose length is the first
    power of two that holds it with 1000 zeros on either side, and Fourier transformed.
    Praat's packed spectrum holds DC, Nyquist, then the real and imaginary part of each
    bin in turn; every value from position floor(upfactor * nfft) (1-based) on is
    zeroed, which can leave the real part of the boundary bin standing without its
    imaginary part, and so is the Nyquist value. The inverse transform is read back at
    the sound's samples.
    """
    n = x.size
    spec, nfft = _padded_spectrum(x)
    first = math.floor(upfactor * nfft)  # first packed position (1-based) zeroed
    half = nfft // 2
    # bin k (0 < k < half) holds its real part at position 2 k + 1, its imaginary part
    # at 2 k + 2; DC at 1 (no imaginary part), Nyquist at 2
    spec.real[max(1, -(-(first - 1) // 2)) : half] = 0.0
    spec.imag[max(1, -(-(first - 2) // 2)) : half] = 0.0
    spec[0] = spec[0].real if first > 1 else 0.0
    spec[half] = 0.0
    out = sfft.irfft(spec, nfft, overwrite_x=True)
    return out[_ANTI_TURN_AROUND : _ANTI_TURN_AROUND + n]


def _fft_upsample2(x: np.ndarray) -> np.ndarray:
    """Praat's exact doubling of the sampling rate (Sound_upsample).

    The sound, after 1000 zeros, is transformed in a power-of-two buffer with at least
    1000 zeros on either side; the top 5 % of the packed spectrum is tapered linearly
    to zero and its Nyquist value dropped; the result is taken as the lower half of the
    spectrum of a buffer twice as long, transformed back and read at the 2 n new samples.
    """
    n = x.size
    spec, nfft = _padded_spectrum(x)
    half = nfft // 2
    imin = int(nfft * 0.95)
    pos = np.arange(1, nfft + 1)
    taper = np.where(pos > imin, (nfft - pos) / (nfft - imin), 1.0)
    k = np.arange(1, half)
    big = np.zeros(nfft + 1, dtype=complex)  # spectrum of the 2 nfft buffer
    big[0] = spec[0].real * taper[0]
    big[1:half] = spec.real[1:half] * taper[2 * k] + 1j * (spec.imag[1:half] * taper[2 * k + 1])
    out = sfft.irfft(big, 2 * nfft) * (2 * nfft) / nfft
    return out[2 * _ANTI_TURN_AROUND : 2 * _ANTI_TURN_AROUND + 2 * n]


def _kernel(j: np.ndarray, g: np.ndarray, depth) -> np.ndarray:
    """Praat's windowed-sinc weight of the sample j + g samples away (j = 0, 1, ...,
    0 < g < 1 the distance to the nearest sample on that side): sin(pi a) / (pi a) times
    the raised cosine (1 + cos(pi a / (depth + g))) / 2, a = j + g."""
    a = np.pi * g + np.pi * j
    sign = np.where(j % 2 == 0, 1.0, -1.0)
    return 0.5 * np.sin(np.pi * g) * sign / a * (1.0 + np.cos(a / (g + depth)))


def _sinc_weights(frac: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Weights of Praat's sinc interpolation at 0 < frac < 1 past sample `midleft`, for
    the samples midleft - 49 .. midleft + 50 (columns 0..99); `depth` samples are used
    on either side (the window is stretched to depth + 1 - frac on the right and
    depth + frac on the left), the others get no weight."""
    frac = np.asarray(frac, dtype=float)[:, None]
    depth = np.asarray(depth)[:, None]
    j = np.arange(SINC_DEPTH)[None, :]
    left = np.where(j < depth, _kernel(j, frac, depth), 0.0)
    right = np.where(j < depth, _kernel(j, 1.0 - frac, depth), 0.0)
    return np.concatenate([left[:, ::-1], right], axis=1)


def _interpolate_sinc(y: np.ndarray, y_pad: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Praat's NUM_interpolate_sinc of depth 50 at the (1-based, real) sample positions `index`.

    y_pad is y with 50 zeros before and 51 after. Outside 1..n the end values are
    repeated; at whole positions the sample itself is taken; elsewhere the depth is cut
    to the samples available on the shorter side, which gives linear interpolation
    next to the ends, Praat's cubic formula one sample further in, and the sinc beyond.
    """
    n = y.size
    out = np.empty(index.size)
    step = max(1, _CHUNK // (2 * SINC_DEPTH))
    cols = np.arange(2 * SINC_DEPTH)
    for lo in range(0, index.size, step):
        x = index[lo : lo + step]
        midleft = np.floor(x)
        frac = x - midleft
        ml = np.clip(midleft, 1, n).astype(np.int64)  # safe for the gathers
        depth = np.minimum(SINC_DEPTH, np.minimum(ml, n - ml))

        def at(i):  # y at 1-based positions, zero outside
            return y_pad[np.clip(i, 1 - SINC_DEPTH, n + SINC_DEPTH) - 1 + SINC_DEPTH]

        yl, yr = at(ml), at(ml + 1)
        val = np.zeros(x.size)
        s = np.flatnonzero((depth >= 3) & (frac > 0))
        if s.size:
            w = _sinc_weights(frac[s], depth[s])
            val[s] = np.einsum("ij,ij->i", w, y_pad[ml[s, None] + cols[None, :]])
        linear = yl + frac * (yr - yl)
        dyl = 0.5 * (yr - at(ml - 1))
        dyr = 0.5 * (at(ml + 2) - yl)
        fil, fir = frac, 1.0 - frac
        cubic = yl * fir + yr * fil - fil * fir * (0.5 * (dyr - dyl) + (fil - 0.5) * (dyl + dyr - 2 * (yr - yl)))
        nearest = at(np.floor(x + 0.5).astype(np.int64).clip(1, n))
        val = np.where(depth == 2, cubic, val)
        val = np.where(depth == 1, linear, val)
        val = np.where(depth <= 0, nearest, val)
        val = np.where(x == midleft, yl, val)
        val = np.where(x > n, y[-1], val)
        val = np.where(x < 1, y[0], val)
        out[lo : lo + step] = val
    return out


def _fine_kernel(up: int, shift: float = 0.0) -> np.ndarray:
    """Praat's depth-50 sinc kernel at the distances (d / up + shift) samples,
    d = -(50 up - 1) .. 50 up - 1: 1 at distance 0, 0 at the other whole distances."""
    dist = np.arange(-(SINC_DEPTH * up - 1), SINC_DEPTH * up)
    if shift == 0.0:
        e = np.abs(dist)
        j, g = e // up, (e % up) / up
        whole = g == 0
        w = _kernel(j, np.where(whole, 0.5, g), SINC_DEPTH)
        return np.where(whole, (e == 0).astype(float), w)
    e = np.abs(dist / up + shift)
    j = np.floor(e)
    g = e - j
    return np.where(e < SINC_DEPTH, _kernel(j.astype(np.int64), g, SINC_DEPTH), 0.0)


def _polyphase(
    y: np.ndarray, kern: np.ndarray, slope: np.ndarray, up: int, down: int, lead: int, count: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """sum_j kern[c + (lead + down k) - up j] y[j], k = 0..count-1, c the kernel's centre:
    the kernel laid with its centre at position (lead + down k) / up samples (0-based)
    of y; and the same sums with `slope`, a kernel of the same length. Each sum adds
    its terms in order of the samples. None if the first position lies before the
    kernels' reach."""
    size = kern.size
    c = size // 2
    if lead + c < 0:
        return None
    # the taps of each phase p (kernel indices p, p + up, ...), zero past the kernel's end
    taps = -(-size // up)
    phases = np.zeros((2, up, taps))
    for p in range(up):
        phases[0, p, : len(kern[p::up])] = kern[p::up]
        phases[1, p, : len(slope[p::up])] = slope[p::up]
    value, deriv = _polyphase_sums(
        np.ascontiguousarray(y, dtype=np.float64), phases, int(up), int(down), int(lead + c), int(count)
    )
    return value, deriv


#: outputs of one phase accumulated together in `_polyphase_sums`
_POLYPHASE_BLOCK = 256


@kernel
def _polyphase_sums(y, phases, up, down, first, count):  # pragma: no cover - compiled
    """The sums of `_polyphase` for the kernels split by phase (phases[q, p, t] is
    kernel q at index p + up t). Output k has kernel index pos = first + down k at
    sample 0, so phase pos % up, and takes sample pos // up - t with tap t. Outputs
    that share a phase (every up / gcd(up, down)-th) step through the samples
    together, so each tap is one multiply-add along a block of them: y is split into
    down / gcd(up, down) interleaved rows (zero-padded), in which those samples are
    neighbours. Each output's sum still runs over its samples in order (t from the last
    tap down), as scipy.signal.upfirdn adds them."""
    n, n_k, taps = y.shape[0], phases.shape[0], phases.shape[2]
    g = math.gcd(up, down)
    period, jstep = up // g, down // g
    pad = taps + jstep
    rows = (n + 2 * pad + jstep - 1) // jstep
    ys = np.zeros((jstep, rows))
    for j in range(n):
        ys[(j + pad) % jstep, (j + pad) // jstep] = y[j]
    out = np.empty((n_k, count))
    acc = np.empty(_POLYPHASE_BLOCK)
    for c in range(min(period, count)):
        n_m = (count - c + period - 1) // period
        pos = first + down * c
        p, top = pos % up, pos // up
        for q in range(n_k):
            for mb in range(0, n_m, _POLYPHASE_BLOCK):
                size = min(_POLYPHASE_BLOCK, n_m - mb)
                a = acc[:size]
                a[:] = 0.0
                for t in range(taps - 1, -1, -1):  # the samples in order, as scipy's upfirdn adds them
                    w = phases[q, p, t]
                    j = top + jstep * mb - t + pad
                    row = ys[j % jstep, j // jstep : j // jstep + size]
                    for m in range(size):
                        a[m] += w * row[m]
                for m in range(size):
                    out[q, c + period * (mb + m)] = a[m]
    return out[0], out[1]


def _resample(x: np.ndarray, sr: float, new_sr: float) -> tuple[np.ndarray, float, float]:
    """Praat's Sound_resample (precision 50) of a sound whose samples lie at (i + 0.5) / sr.

    Returns the new samples, the time of the first (s) and the sampling step (s).
    Praat's interpolating kernel depends only on the distance to each sample, so where
    the rate ratio is a fraction Q / P with a small denominator, the samples far enough
    from the ends (all 50 samples either side present) are a polyphase filtering
    (upsample by 2 P, filter, keep every 2 Q-th); it is done at the exact positions,
    plus a first-order term in the few 1e-11 samples by which Praat's floating-point
    positions differ from them. The samples near the ends are interpolated one by one.
    """
    n = x.size
    dx, x1, xmax = 1.0 / sr, 0.5 / sr, n / sr
    upfactor = new_sr * dx
    if abs(upfactor - 2.0) < 1e-6:
        new_dx = dx / 2
        return _fft_upsample2(x), x1 - 0.5 * (dx - new_dx), new_dx
    if abs(upfactor - 1.0) < 1e-6:
        return x.copy(), x1, dx
    n_new = math.floor(xmax * new_sr + 0.5)
    if n_new < 1:
        raise ValueError("the resampled sound would have no samples")
    y = _fft_lowpass(x, upfactor) if upfactor < 1.0 else x
    new_dx = 1.0 / new_sr
    new_x1 = 0.5 * (0.0 + xmax - (n_new - 1) / new_sr)
    out = np.empty(n_new)
    done = np.zeros(n_new, dtype=bool)

    ratio = Fraction(sr) / Fraction(new_sr)  # input samples per output sample
    P, Q = ratio.denominator, ratio.numerator
    if P <= _MAX_PHASES and n_new > 4 * P:
        # Positions (1-based) k = 0..n_new-1: index_k = (P (n + 1) - (n_new - 1) Q + 2 k Q) / (2 P).
        up, down = 2 * P, 2 * Q
        base = P * (n + 1) - (n_new - 1) * Q
        k = np.arange(n_new, dtype=np.int64)
        num = base + down * k
        midleft = num // up
        inner = np.flatnonzero((midleft > SINC_DEPTH) & (midleft < n - SINC_DEPTH))
        if inner.size:
            k_lo, k_hi = int(inner[0]), int(inner[-1])
            lead = base - up + down * k_lo  # (0-based position of sample k_lo) * up
            count = k_hi - k_lo + 1
            eps = 1e-5  # the kernel's slope, for the first-order term
            slope = (_fine_kernel(up, eps) - _fine_kernel(up, -eps)) / (2 * eps)
            sums = _polyphase(y, _fine_kernel(up), slope, up, down, lead, count)
            if sums is not None:
                value, deriv = sums
                kk = k[k_lo : k_hi + 1]
                index = ((new_x1 + kk.astype(float) * new_dx) - x1) / dx + 1.0
                offset = (index - midleft[k_lo : k_hi + 1]) - (num[k_lo : k_hi + 1] % up) / up
                out[k_lo : k_hi + 1] = value + offset * deriv
                done[k_lo : k_hi + 1] = True
    rest = np.flatnonzero(~done)
    if rest.size:
        y_pad = np.concatenate([np.zeros(SINC_DEPTH), y, np.zeros(SINC_DEPTH + 1)])
        index = ((new_x1 + rest.astype(float) * new_dx) - x1) / dx + 1.0
        out[rest] = _interpolate_sinc(y, y_pad, index)
    return out, new_x1, new_dx


@kernel
def _tapered_frames(s, first, taper, block):  # pragma: no cover - compiled
    """Row r of `block` (its first len(taper) values): the samples s[first[r]:] of one
    frame minus their mean (summed as numpy.mean sums), times the taper; the rest of the
    row is left alone."""
    nw = taper.shape[0]
    for r in range(first.shape[0]):
        f = first[r]
        mean = pairwise_sum(s, f, nw) / nw
        for i in range(nw):
            block[r, i] = (s[f + i] - mean) * taper[i]


@kernel
def _power(spec, out):  # pragma: no cover - compiled
    """|spec|^2 + 1e-300 (re^2 + im^2) into out, element by element."""
    for r in range(spec.shape[0]):
        for k in range(spec.shape[1]):
            v = spec[r, k]
            out[r, k] = v.real * v.real + v.imag * v.imag + 1e-300


def power_cepstrogram(
    x: np.ndarray, sr: float, pitch_floor: float, time_step: float, max_frequency: float, pre_emphasis_from: float
) -> tuple[np.ndarray, float, float, tuple[float, float], float]:
    """Praat 6.1.38's "Sound: To PowerCepstrogram" followed by "To Matrix".

    x: mono signal (samples at (i + 0.5) / sr s, time domain 0 .. len(x) / sr s, as
    parselmouth.Sound(x, sampling_frequency=sr) makes it); sr (Hz); pitch_floor (Hz):
    the window is 6 / pitch_floor s (the whole sound if it is shorter); time_step (s);
    max_frequency (Hz): the sound is resampled to twice this; pre_emphasis_from (Hz).
    Returns (values, x1, dx, (xmin, xmax), ymax): the power cepstra, shape
    (quefrencies, frames), at quefrencies 0 .. ymax s in equal steps and frames at
    x1 + i dx s, the sound's time domain (s) and the top quefrency (s), exactly the
    values `voicebias.instruments.cpps.cepstrogram_cpps` takes. `values` is the transpose of a
    C-ordered (frames, quefrencies) array.

    Steps, per Praat: (1) resample (see `_resample`); (2) pre-emphasis
    s[i] -= exp(-2 pi F dt) s[i - 1], unless F is at or above the Nyquist frequency;
    (3) frames: floor((duration - window) / time_step) + 1 of them (counted on the
    original sound), centred on the sound's middle; a frame takes
    round(window * 2 max_frequency) samples from the sample nearest to its start (zero
    beyond the sound), has their mean (over the whole frame) removed and is multiplied
    by (exp(-48 (i - m)^2 / (n + 1)^2) - e^-12) / (1 - e^-12), m = (n + 1) / 2,
    i = 1..n; (4) the spectrum is the FFT (zero-padded to the next power of two, at
    least 2) times the sampling step; its log power log(re^2 + im^2 + 1e-300) goes
    through the inverse FFT times the frequency step, and the frame's column is the
    square of the first nfft / 2 + 1 values. The frames are transformed in batches;
    the resampling is polyphase filtering when the rate ratio has a small denominator.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 2 and x.shape[0] == 1:
        x = x[0]
    if x.ndim != 1 or x.size < 1:
        raise ValueError("x must be a non-empty mono signal")
    sr = float(sr)
    n = x.size
    dx = 1.0 / sr
    duration = dx * n
    xmin, xmax = 0.0, n / sr
    win_dur = 2.0 * (3.0 / pitch_floor)
    if win_dur > duration:
        win_dur = duration
    fs = 2 * max_frequency

    s, s_x1, s_dx = _resample(x, sr, fs)
    if pre_emphasis_from < 0.5 / s_dx:
        pe = math.exp(-2.0 * math.pi * pre_emphasis_from * s_dx)
        s[1:] = s[1:] - pe * s[:-1]

    # frame times from the original sound (Sampled_shortTermAnalysis)
    n_frames = math.floor((duration - win_dur) / time_step) + 1
    mid = 0.5 / sr - 0.5 * dx + 0.5 * duration
    t1 = mid - 0.5 * (n_frames * time_step) + 0.5 * time_step

    nw = _c_round(win_dur * fs)
    if nw < 1:
        raise ValueError("the analysis window holds no sample")
    nfft = 2
    while nfft < nw:
        nfft *= 2
    nq = nfft // 2 + 1
    qmax = 0.5 * nfft / fs

    i = np.arange(1, nw + 1, dtype=float)
    imid = 0.5 * (nw + 1)
    edge = math.exp(-12.0)
    gauss = (np.exp(-48.0 * (i - imid) * (i - imid) / (nw + 1) / (nw + 1)) - edge) / (1 - edge)

    t = t1 + np.arange(n_frames, dtype=float) * time_step
    first = np.floor((t - win_dur / 2 - s_x1) / s_dx + 1.0 + 0.5).astype(np.int64)  # 1-based
    pad = nw + 1
    s_pad = np.concatenate([np.zeros(pad), s, np.zeros(pad)])
    first = np.clip(first - 1 + pad, 0, s_pad.size - nw)
    spec_step = 1.0 / fs  # the frame's sampling step: the spectrum's scale
    freq_step = 1.0 / (spec_step * nfft)  # the spectrum's frequency step: the cepstrum's scale
    taper = gauss * spec_step

    # ceps = DCT-I of the log power = nfft * irfft, i.e. the unnormalised inverse FFT
    out = np.empty((n_frames, nq))
    step = max(1, _FRAME_CHUNK // nfft)
    buf = np.zeros((min(step, n_frames), nfft))
    power = np.empty((min(step, n_frames), nq))
    for lo in range(0, n_frames, step):
        block = buf[: min(step, n_frames - lo)]
        _tapered_frames(s_pad, first[lo : lo + step], taper, block)
        spec = np.fft.rfft(block, axis=1)
        part = power[: block.shape[0]]
        _power(spec, part)
        np.log(part, out=part)
        ceps = sfft.dct(part, type=1, axis=1)
        ceps *= freq_step
        np.multiply(ceps, ceps, out=out[lo : lo + step])
    return out.T, t1, time_step, (xmin, xmax), qmax
