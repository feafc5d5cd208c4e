"""Synthetic carrier-gate inputs, clean or with a planted pitch leak."""

from __future__ import annotations

import numpy as np
import pandas as pd


def gate_inputs(leak_st=0.0, flip=None, seed=3, noise_st=0.3):
    """60 inputs per language with no content effect, or a planted pitch leak for feminine content
    (Spanish); `noise_st`: the within-voice SD of F0 (semitones)."""
    rng = np.random.default_rng(seed)
    rows = []
    for lang in ("en", "es"):
        for pole in ("masculine", "neutral", "feminine"):
            for voice, f0 in (("male", 4.0), ("female", 13.0)):
                for i in range(10):
                    st = f0 + rng.normal(0, noise_st) + (leak_st if pole == "feminine" and lang == "es" else 0.0)
                    margin = (st - 8.5) * 3
                    sid = f"{lang}-{pole}-{i:02d}-{voice}"
                    if sid == flip:
                        margin = -margin
                    rows.append(
                        {
                            "stimulus_id": sid,
                            "lang": lang,
                            "pole": pole,
                            "voice_gender": voice,
                            "status": "ok",
                            "f0_median_st": st,
                            "margin_clf": margin,
                            "composite": (st - 8.5) / 4.5,
                        }
                    )
    return pd.DataFrame(rows)
