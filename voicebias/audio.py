"""Audio input/output helpers: reading, checking, resampling, loudness and hashing.

Audio is read with soundfile and stored as 16-bit FLAC. `load_for_analysis` reads a file for the
instrument: stereo is averaged to mono and other sample rates are resampled (both reported in a note),
and bad input is refused with an `AudioError` whose `code` names the case (missing, not_audio,
truncated, empty, nan, silent, clipped, low_sample_rate, too_long, stereo_cancels; the acoustic
instrument adds no_voicing, too_short and measure_error), so a batch can count its exclusions by
reason. `read_part`, `write_audio`, `flac_bytes` and `sha256_file` serve the stages and caches.

The reason codes and when each applies: docs/instrument.md, "Reading audio".
"""

from __future__ import annotations

import hashlib
import io
import struct
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from voicebias.errors import VoicebiasError


class AudioError(VoicebiasError, ValueError):
    """An audio file that cannot be measured, with the reason in plain words.

    `code` is a short machine-readable reason (see the module docstring) used to
    count exclusions.
    """

    def __init__(self, message: str, code: str = "unreadable"):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class AudioChecks:
    """Limits applied when a file is read for analysis.

    min_sample_rate: Hz; below it the file is refused (the analysis band would be cut).
    max_duration_s: seconds; longer files are refused before decoding.
    max_clipped_fraction: share of samples at or above `clip_level` (of full scale)
        tolerated before the file is refused: clipping flattens the glottal pulse
        and adds harmonics, biasing H1-H2, H1-A3 and CPPS.
    silence_dbfs: RMS level (dB re full scale) below which a file counts as silent.
    """

    min_sample_rate: int = 11025
    max_duration_s: float = 600.0
    max_clipped_fraction: float = 0.001
    clip_level: float = 0.999
    silence_dbfs: float = -60.0


@dataclass
class LoadedAudio:
    """A mono float32 signal ready for analysis, with what was done to it."""

    x: np.ndarray
    sr: int
    source_sr: int
    channels: int
    notes: list[str] = field(default_factory=list)


#: Praat's autocorrelation pitch analysis (Sound: To Pitch) uses a window of this many
#: periods of the pitch floor
PITCH_WINDOW_PERIODS = 3.0
#: voiced pitch frames a file needs: fewer is `no_voicing`, and a signal too short to
#: give this many frames at all is `too_short`
MIN_VOICED_FRAMES = 3


def min_analysable_s(pitch_floor: float, time_step: float) -> float:
    """The shortest signal (s) the acoustic measure set can measure: the pitch window
    (PITCH_WINDOW_PERIODS periods of `pitch_floor`, Hz) plus MIN_VOICED_FRAMES - 1 time
    steps of `time_step` (s).

    >>> round(min_analysable_s(60.0, 0.01), 6)
    0.07
    """
    return PITCH_WINDOW_PERIODS / float(pitch_floor) + (MIN_VOICED_FRAMES - 1) * float(time_step)


def resample(x: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Polyphase resampling (anti-aliased) from sr_in to sr_out Hz."""
    if sr_in == sr_out:
        return x.astype(np.float32, copy=False)
    from scipy.signal import resample_poly  # imported here: ~1 s, and most readers never resample

    frac = Fraction(sr_out, sr_in).limit_denominator(1000)
    return resample_poly(x, frac.numerator, frac.denominator).astype(np.float32)


def rms_dbfs(x: np.ndarray) -> float:
    """Root-mean-square level in dB re full scale (a full-scale sine reads -3 dBFS)."""
    rms = float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.0
    return 20.0 * np.log10(rms) if rms > 0 else float("-inf")


def clipped_fraction(x: np.ndarray, level: float = 0.999) -> float:
    """Share of samples whose magnitude is at or above `level` (fraction of full scale)."""
    return float(np.mean(np.abs(x) >= level)) if x.size else 0.0


def normalize_rms(x: np.ndarray, target_dbfs: float) -> tuple[np.ndarray, float]:
    """Scale to a target RMS level; the gain is lowered if peaks would clip.

    Returns the scaled signal and the gain applied in dB.
    """
    level = rms_dbfs(x)
    if not np.isfinite(level):
        raise AudioError("signal is silent: cannot normalise loudness", code="silent")
    gain = 10 ** ((target_dbfs - level) / 20.0)
    peak = float(np.max(np.abs(x))) * gain
    if peak > 0.99:
        gain *= 0.99 / peak
    return (x * gain).astype(np.float32), 20.0 * np.log10(gain)


def write_audio(path: Path, x: np.ndarray, sr: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.clip(x, -1.0, 1.0), sr, subtype="PCM_16", format="FLAC")


def flac_bytes(x: np.ndarray, sr: int) -> bytes:
    """The bytes of the file `write_audio(path, x, sr)` writes (written to a temporary file
    and read back, so they are those bytes by construction)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="voicebias-flac-") as tmp:
        path = Path(tmp) / "audio.flac"
        write_audio(path, x, sr)
        return path.read_bytes()


def flac_matches(data: bytes, x: np.ndarray, sr: int) -> bool:
    """Whether FLAC bytes hold as many frames of one channel as `x` at `sr` (a cheap check, from the header)."""
    try:
        info = sf.info(io.BytesIO(data))
    except RuntimeError:  # soundfile.LibsndfileError: not a sound file libsndfile can open
        return False
    return info.format == "FLAC" and info.channels == 1 and info.samplerate == int(sr) and info.frames == len(x)


def _wav_truncation(path: Path | str) -> tuple[int, int] | None:
    """(declared, present) data bytes of a RIFF/WAVE file whose data chunk is cut short.

    libsndfile silently shortens such files to what is there, so a file cut off
    during a copy would otherwise be measured as a shorter recording.
    """
    with open(path, "rb") as fh:
        head = fh.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            return None
        while True:
            chunk = fh.read(8)
            if len(chunk) < 8:
                return None
            cid, size = chunk[:4], struct.unpack("<I", chunk[4:])[0]
            if cid == b"data":
                start = fh.tell()
                fh.seek(0, io.SEEK_END)
                present = fh.tell() - start
                return (size, present) if present < size and size != 0xFFFFFFFF else None
            fh.seek(size + (size & 1), io.SEEK_CUR)


def _open(path: Path | str):
    try:
        return sf.info(str(path))
    except (sf.LibsndfileError, RuntimeError) as exc:
        raise AudioError(f"{path}: not a readable audio file ({exc})", code="not_audio") from exc


def _decode(path: Path | str, frames: int) -> tuple[np.ndarray, int]:
    try:
        x, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError) as exc:
        raise AudioError(
            f"{path}: truncated or corrupt audio stream: the header declares {frames} samples "
            f"but decoding failed ({exc})",
            code="truncated",
        ) from exc
    return x, sr


def read_audio(path: Path | str, target_sr: int | None = None) -> tuple[np.ndarray, int]:
    """Read a file as mono float32 (channels averaged), optionally resampled.

    Raises AudioError on unreadable, truncated, empty or NaN-holding files.
    """
    loaded = load_for_analysis(
        path,
        target_sr,
        AudioChecks(
            min_sample_rate=1, max_duration_s=float("inf"), max_clipped_fraction=1.0, silence_dbfs=float("-inf")
        ),
    )
    return loaded.x, loaded.sr


def load_for_analysis(path: Path | str, target_sr: int | None = None, checks: AudioChecks | None = None) -> LoadedAudio:
    """Read, check and convert one file for acoustic analysis.

    Refusals raise AudioError with a `code` (module docstring); accepted conversions
    (stereo averaged to mono, resampling to `target_sr` Hz) are listed in `notes`.
    """
    checks = checks or AudioChecks()
    if not Path(path).is_file():
        raise AudioError(f"{path}: file not found", code="missing")
    info = _open(path)
    cut = _wav_truncation(path)
    if cut:
        raise AudioError(
            f"{path}: truncated file: the header declares {cut[0]} bytes of audio, the file holds {cut[1]}",
            code="truncated",
        )
    if info.frames == 0:
        raise AudioError(f"{path}: file holds no samples", code="empty")
    duration = info.frames / info.samplerate
    if duration > checks.max_duration_s:
        raise AudioError(
            f"{path}: too long ({duration:.0f} s > {checks.max_duration_s:g} s allowed); cut it into utterances first",
            code="too_long",
        )
    if info.samplerate < checks.min_sample_rate:
        raise AudioError(
            f"{path}: sample rate {info.samplerate} Hz is too low: the analysis needs at least "
            f"{checks.min_sample_rate} Hz (content up to the formant ceiling)",
            code="low_sample_rate",
        )
    x2, sr = _decode(path, info.frames)
    if x2.size == 0:
        raise AudioError(f"{path}: file holds no samples", code="empty")
    if not np.all(np.isfinite(x2)):
        bad = int((~np.isfinite(x2)).sum())
        raise AudioError(f"{path}: samples contain NaN or infinity ({bad} of {x2.size})", code="nan")
    notes = []
    channels = x2.shape[1]
    x = x2.mean(axis=1)
    if channels > 1:
        mixed, each = rms_dbfs(x), max(rms_dbfs(x2[:, c]) for c in range(channels))
        if np.isfinite(each) and mixed < each - 20.0:
            raise AudioError(
                f"{path}: the {channels} channels cancel when averaged to mono "
                f"({mixed:.0f} dBFS vs {each:.0f} dBFS per channel): check the polarity",
                code="stereo_cancels",
            )
        notes.append(f"{channels} channels averaged to mono")
    level = rms_dbfs(x)
    if level < checks.silence_dbfs:
        raise AudioError(f"{path}: silent (RMS {level:.1f} dBFS, below {checks.silence_dbfs:g} dBFS)", code="silent")
    clip = max(clipped_fraction(x2[:, c], checks.clip_level) for c in range(channels))
    if clip > checks.max_clipped_fraction:
        raise AudioError(
            f"{path}: clipped: {100 * clip:.2f}% of samples at full scale "
            f"(more than {100 * checks.max_clipped_fraction:g}% allowed)",
            code="clipped",
        )
    source_sr = sr
    if target_sr and sr != target_sr:
        x, sr = resample(x, sr, target_sr), target_sr
        notes.append(f"resampled from {source_sr} Hz to {target_sr} Hz")
    return LoadedAudio(x.astype(np.float32, copy=False), int(sr), int(source_sr), int(channels), notes)


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


def read_part(path: str, settings: Any, sample_rate: int, part: str) -> tuple[np.ndarray, int, dict[str, Any]]:
    """The signal of one part of a file as the instrument reads it (checked, mono,
    resampled), with {duration_s, note}: the whole file or either half of the signal as read
    (`part`). `settings` gives the checks (its `checks()`). Raises AudioError."""
    loaded = load_for_analysis(path, target_sr=sample_rate, checks=settings.checks())
    x = loaded.x
    h = len(x) // 2
    x = x if part == "whole" else x[:h] if part == "first_half" else x[h:]
    return x, loaded.sr, {"duration_s": float(len(x) / loaded.sr), "note": "; ".join(loaded.notes)}
