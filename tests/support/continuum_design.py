"""Simulated answers on a voice continuum with planted psychometric truth.

The design of the embedded continuum: 7 steps from 120 to 220 Hz (10.5 st) with formants scaled
by up to 1.18, passages per content pole, each voiced on the continuum from a male and a female
base voice, one answer per passage x base voice x step. Planted:

    logit P(female) = slope * (x - pse_masculine - shift * feminine) + passage + base voice

so the planted PSE of the masculine pole is `pse_masculine` (st above the male endpoint), the
feminine pole's is pse_masculine + shift, and `shift` is PSE(feminine) - PSE(masculine).
Optional `guess` and `lapse` squash the function between guess and 1 - lapse.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from voicebias.stimuli.continuum import Continuum

CONTINUUM = Continuum(steps=7, f0_male_hz=120.0, f0_female_hz=220.0, formant_ratio=1.18)


def continuum_answers(
    seed: int,
    slope: float = 0.6,
    pse_masculine: float = 6.0,
    shift: float = -2.0,
    sd_passage: float = 0.5,
    sd_voice: float = 0.3,
    passages: int = 10,
    base_voices: int = 1,
    repeats: int = 1,
    guess: float = 0.0,
    lapse: float = 0.0,
    lang: str = "en",
    continuum: Continuum = CONTINUUM,
) -> pd.DataFrame:
    """One row per answer (y, step, pole, passage_id, base_voice, lang); `base_voices` per gender."""
    rng = np.random.default_rng(seed)
    voices = {f"{g}{i}": rng.normal(0, sd_voice) for g in ("m", "f") for i in range(base_voices)}
    rows = []
    for pole in ("masculine", "feminine"):
        pse = pse_masculine + (shift if pole == "feminine" else 0.0)
        for i in range(passages):
            u = rng.normal(0, sd_passage)
            for v, uv in voices.items():
                for step in range(continuum.steps):
                    eta = slope * (continuum.semitones(step) - pse) + u + uv
                    p = guess + (1 - guess - lapse) / (1 + np.exp(-eta))
                    for _ in range(repeats):
                        rows.append(
                            {
                                "y": float(rng.random() < p),
                                "step": step,
                                "pole": pole,
                                "passage_id": f"{lang}-{pole}-{i:02d}",
                                "base_voice": v,
                                "lang": lang,
                            }
                        )
    return pd.DataFrame(rows)
