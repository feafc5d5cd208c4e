"""Frames of a signal, windowed into a reused zero-padded buffer, for the spectra of the formant and
harmonic-level analyses."""

from __future__ import annotations

from voicebias.instruments.jit import kernel

#: values per batch of zero-padded frames transformed at once: small enough that a batch
#: and its spectra stay in the processor's cache (a whole file's frames at once spend
#: about as long writing memory as transforming)
FFT_CHUNK = 1 << 17


@kernel
def windowed_frames(x, starts, windows, which, lengths, out):  # pragma: no cover - compiled
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
