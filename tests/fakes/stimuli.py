"""Small real stimulus sets for adapter tests: FLAC files with distinct samples and a manifest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from voicebias.audio import sha256_file, write_audio

POLES = ("masculine", "neutral", "feminine")


def make_stimuli(root: Path, n: int, langs: tuple[str, ...] = ("en",), seconds: float = 0.25,
                 sr: int = 16000) -> pd.DataFrame:
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
            rows.append({"stimulus_id": sid, "passage_id": f"{lang}-{pole}-{i:03d}", "lang": lang, "pole": pole,
                         "voice_gender": gender, "voice_id": f"{lang}-{gender}", "path": str(path),
                         "sha256": sha256_file(root / path)})
    return pd.DataFrame(rows)
