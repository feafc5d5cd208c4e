"""Audio input/output helpers: reading, resampling, loudness and hashing.

Audio is read with soundfile (torchaudio.load would need torchcodec). Files are
stored as 16-bit FLAC: lossless, about half the size of WAV.
"""

from __future__ import annotations

import hashlib
import io
from fractions import Fraction
from pathlib import Path

import numpy as np
import soundfile as sf
from scipy.signal import resample_poly


class AudioError(ValueError):
    """An audio file that cannot be measured, with the reason in plain words."""


def resample(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Polyphase resampling (anti-aliased) from sr_in to sr_out Hz."""
    if sr_in == sr_out:
        return x.astype(np.float32, copy=False)
    frac = Fraction(sr_out, sr_in).limit_denominator(1000)
    return resample_poly(x, frac.numerator, frac.denominator).astype(np.float32)


def rms_dbfs(x: np.ndarray) -> float:
    """Root-mean-square level in dB re full scale (a full-scale sine reads -3 dBFS)."""
    rms = float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.0
    return 20.0 * np.log10(rms) if rms > 0 else float("-inf")


def normalize_rms(x: np.ndarray, target_dbfs: float) -> tuple[np.ndarray, float]:
    """Scale to a target RMS level; the gain is lowered if peaks would clip.

    Returns the scaled signal and the gain applied in dB.
    """
    level = rms_dbfs(x)
    if not np.isfinite(level):
        raise AudioError("signal is silent: cannot normalise loudness")
    gain = 10 ** ((target_dbfs - level) / 20.0)
    peak = float(np.max(np.abs(x))) * gain
    if peak > 0.99:
        gain *= 0.99 / peak
    return (x * gain).astype(np.float32), 20.0 * np.log10(gain)


def write_audio(path: Path, x: np.ndarray, sr: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.clip(x, -1.0, 1.0), sr, subtype="PCM_16", format="FLAC")


def read_audio(path: Path | str, target_sr: int | None = None) -> tuple[np.ndarray, int]:
    """Read a file as mono float32, optionally resampled; raises AudioError on bad input."""
    try:
        x, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError) as exc:
        raise AudioError(f"{path}: not a readable audio file ({exc})") from exc
    x = x.mean(axis=1)
    if x.size == 0:
        raise AudioError(f"{path}: file holds no samples")
    if not np.all(np.isfinite(x)):
        raise AudioError(f"{path}: samples contain NaN or infinity")
    if target_sr and sr != target_sr:
        x, sr = resample(x, sr, target_sr), target_sr
    return x, sr


def wav_bytes(x: np.ndarray, sr: int) -> bytes:
    """16-bit PCM WAV bytes, as HTTP audio APIs expect."""
    buf = io.BytesIO()
    sf.write(buf, np.clip(x, -1.0, 1.0), sr, subtype="PCM_16", format="WAV")
    return buf.getvalue()


def sha256_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
