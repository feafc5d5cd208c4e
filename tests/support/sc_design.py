"""Simulated speech-continuation voice-quality tables shaped like the real design.

prompts x 4 voices (2 per gender) x 4 phonation conditions; every stimulus is measured
once as a prompt and once per continuation system, in the long format of
`voicebias.analysis.sc.vq_long` (prompt rows have no system).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

VOICES = {"f1": "female", "f2": "female", "m1": "male", "m2": "male"}
SHIFTS = {"modal": 0.0, "breathy": 4.0, "creaky": -3.0, "endcreak": -1.5}


def simulate_vq(
    n_systems: int = 1,
    prompts: int = 30,
    seed: int = 0,
    retention: dict[str, float] | None = None,
    system_offsets: tuple[float, ...] | None = None,
    noise: float = 0.6,
    voice_shift_sd: float = 0.0,
) -> pd.DataFrame:
    """One simulated table of H1-H2 (column h1_h2_db) for prompts and continuations.

    Prompt = voice + voice x condition + prompt + recording + condition shift + noise
    (the stimuli vary like real ones). Continuation of system k = prompt value
    - (1 - retention[gender]) x condition shift + system_offsets[k]
    + voice-level continuation shift (sd `voice_shift_sd`) + noise (sd `noise`).
    retention None (1 for both genders), offsets None (0) and voice_shift_sd 0: the
    null, continuations keep their prompt's voice quality plus noise.
    """
    rng = np.random.default_rng(seed)
    retention = retention or {"female": 1.0, "male": 1.0}
    offsets = system_offsets if system_offsets is not None else (0.0,) * n_systems
    voices = list(VOICES)
    conds = list(SHIFTS)
    v_eff = dict(zip(voices, rng.normal(0, 1.0, len(voices))))
    vc_eff = {(v, c): rng.normal(0, 0.5) for v in voices for c in conds}
    v_shift = {
        (v, k): rng.normal(0, voice_shift_sd) if voice_shift_sd > 0 else 0.0 for v in voices for k in range(n_systems)
    }
    p_eff = rng.normal(0, 1.0, prompts)
    rows = []
    for v in voices:
        g = VOICES[v]
        rec = rng.normal(0, 0.7, prompts)
        for c in conds:
            prompt_val = v_eff[v] + vc_eff[(v, c)] + p_eff + rec + SHIFTS[c] + rng.normal(0, 0.5, prompts)
            sids = [f"p{p:02d}-{v}-{c}" for p in range(prompts)]
            common = {
                "stimulus_id": sids,
                "prompt_id": [f"p{p:02d}" for p in range(prompts)],
                "voice_id": v,
                "voice_gender": g,
                "phonation": c,
            }
            rows.append(pd.DataFrame({**common, "source": "prompt", "system": np.nan, "h1_h2_db": prompt_val}))
            for k in range(n_systems):
                cont = (
                    prompt_val
                    - (1 - retention[g]) * SHIFTS[c]
                    + offsets[k]
                    + v_shift[(v, k)]
                    + rng.normal(0, noise, prompts)
                )
                rows.append(
                    pd.DataFrame({**common, "source": "continuation", "system": f"sys{k + 1}", "h1_h2_db": cont})
                )
    return pd.concat(rows, ignore_index=True)


def planted_contrast(gender: str, condition: str, retention: dict[str, float], offset: float = 0.0) -> float:
    """Planted continuation - prompt difference of a gender x condition cell (`simulate_vq`)."""
    return -(1 - retention[gender]) * SHIFTS[condition] + offset
