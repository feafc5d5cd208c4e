"""Small real stimulus sets for adapter tests (FLAC files with distinct samples and a
manifest), and synthetic vowels with known formants for the acoustic measures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy.signal import lfilter

from voicebias.audio import sha256_file, write_audio

POLES = ("masculine", "neutral", "feminine")


def make_stimuli(
    root: Path, n: int, langs: tuple[str, ...] = ("en",), seconds: float = 0.25, sr: int = 16000
) -> pd.DataFrame:
    """n stimuli per language, each a distinct tone (so every input has its own fingerprint)."""
    rows = []
    t = np.arange(int(sr * seconds)) / sr
    for lang in langs:
        for i in range(n):
            pole = POLES[i % 3]
            gender = ("male", "female")[(i // 3) % 2]
            sid = f"{lang}-{pole}-{i:03d}-{gender}"
            path = Path("data") / "stimuli" / "audio" / f"{sid}.flac"
            freq = 110 + 7 * i + 500 * langs.index(lang)
            write_audio(root / path, (0.2 * np.sin(2 * np.pi * freq * t)).astype(np.float32), sr)
            rows.append(
                {
                    "stimulus_id": sid,
                    "passage_id": f"{lang}-{pole}-{i:03d}",
                    "lang": lang,
                    "pole": pole,
                    "voice_gender": gender,
                    "voice_id": f"{lang}-{gender}",
                    "path": str(path),
                    "sha256": sha256_file(root / path),
                }
            )
    return pd.DataFrame(rows)


# Adult-male formants F1-F5 (Hz) of five vowels: F1-F3 of /i a u/ from Peterson & Barney
# (1952, Table II, men), of /e o/ from Hillenbrand et al. (1995, Table V, men, /eI/ and
# /o/); F4 and F5 set to typical adult-male values.
MALE_VOWEL_FORMANTS: dict[str, tuple[float, float, float, float, float]] = {
    "i": (270.0, 2290.0, 3010.0, 3500.0, 4200.0),
    "e": (476.0, 2089.0, 2691.0, 3500.0, 4200.0),
    "a": (730.0, 1090.0, 2440.0, 3400.0, 4200.0),
    "o": (497.0, 910.0, 2459.0, 3400.0, 4200.0),
    "u": (300.0, 870.0, 2240.0, 3400.0, 4200.0),
}
# A shorter adult-female vocal tract scales every formant by about 1.17 (Peterson &
# Barney's women/men ratio averaged over vowels and F1-F3 is 1.15-1.20).
FEMALE_TRACT_SCALE = 1.17
VOWEL_BANDWIDTHS = (70.0, 90.0, 130.0, 180.0, 250.0)


def vowel_formants(vowel: str, tract: str) -> tuple[float, ...]:
    """F1-F5 (Hz) of `vowel` (i e a o u) for an adult 'male' or 'female' vocal tract."""
    if vowel not in MALE_VOWEL_FORMANTS:
        raise KeyError(f"no formants for vowel '{vowel}' (known: {' '.join(MALE_VOWEL_FORMANTS)})")
    if tract not in ("male", "female"):
        raise KeyError(f"vocal tract must be 'male' or 'female', not '{tract}'")
    scale = FEMALE_TRACT_SCALE if tract == "female" else 1.0
    return tuple(scale * f for f in MALE_VOWEL_FORMANTS[vowel])


def synthetic_vowel(
    f0: float,
    formants: tuple[float, ...],
    bandwidths: tuple[float, ...] = VOWEL_BANDWIDTHS,
    seconds: float = 0.5,
    sr: int = 16000,
) -> np.ndarray:
    """A steady vowel from a source-filter model: a Rosenberg (1971) glottal flow pulse
    train at `f0` Hz (opening 40 %, closing 16 % of the period, exact fractional
    periods), lip radiation as a first difference, then a cascade of unit-DC-gain
    second-order resonators at `formants` (Hz) with `bandwidths` (Hz). 20 ms linear
    onset and offset ramps; peak 0.5. Returns float32 samples at `sr` Hz."""
    if f0 <= 0 or not formants or len(formants) != len(bandwidths):
        raise ValueError("synthetic_vowel needs f0 > 0 and one bandwidth per formant")
    n = int(round(seconds * sr))
    phase = (f0 * np.arange(n) / sr) % 1.0
    opening, closing = 0.4, 0.16
    flow = np.where(
        phase < opening,
        0.5 * (1 - np.cos(np.pi * phase / opening)),
        np.where(phase < opening + closing, np.cos(0.5 * np.pi * (phase - opening) / closing), 0.0),
    )
    y = np.diff(flow, prepend=0.0)
    for f, bw in zip(formants, bandwidths):
        r = np.exp(-np.pi * bw / sr)
        a = [1.0, -2 * r * np.cos(2 * np.pi * f / sr), r * r]
        y = lfilter([sum(a)], a, y)
    ramp = min(int(0.02 * sr), n // 2)
    envelope = np.ones(n)
    envelope[:ramp], envelope[n - ramp :] = np.linspace(0, 1, ramp), np.linspace(1, 0, ramp)
    y = y * envelope
    return (0.5 * y / np.max(np.abs(y))).astype(np.float32)
