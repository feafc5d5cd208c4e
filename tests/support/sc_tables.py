"""Prompt measures and scored continuation tables with a planted retention per gender."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd


def _planted_tables(keep: dict[str, float], prompts: int = 6, seed: int = 7) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Prompt measures and a scored continuation table with known retention per gender
    (the real design: prompts x 2 voices per gender x 4 conditions)."""
    rng = np.random.default_rng(seed)
    shift = {"modal": (0, 0, 0), "breathy": (3.0, 9.0, -3.0), "creaky": (-2.0, -5.0, -6.0), "endcreak": (-0.5, -1, -2)}
    pm, sc = [], []
    for g, k in keep.items():
        for p, v in itertools.product(range(prompts), (1, 2)):
            base = rng.normal([0.0, 10.0, 14.0], 1.0)
            for c, d in shift.items():
                sid = f"p{p}-{g}{v}-{c}"
                common = {
                    "stimulus_id": sid,
                    "prompt_id": f"p{p}",
                    "voice_gender": g,
                    "voice_id": f"v-{g}{v}",
                    "phonation": c,
                }
                vals = base + np.array(d)
                pm.append(
                    {
                        **common,
                        "measure_status": "ok",
                        "h1_h2_db_whole": vals[0],
                        "h1_a3_db_whole": vals[1],
                        "cpps_db_whole": vals[2],
                    }
                )
                cont = base + k * np.array(d) + rng.normal(0, 0.2, 3)
                sc.append(
                    {
                        **common,
                        "system": "sys",
                        "lang": "en",
                        "prompt_set": "nop",
                        "status": "ok",
                        "measure_status": "ok",
                        "judge_status": "ok",
                        "speaker_similarity": rng.uniform(0.6, 0.9),
                        "h1_h2_db": cont[0],
                        "h1_a3_db": cont[1],
                        "cpps_db": cont[2],
                        "semantic_coherence": int(rng.integers(1, 6)),
                        "sentence_polarity": int(rng.integers(1, 6)),
                        "agency_competence": int(rng.integers(1, 6)) if g == "male" else int(rng.integers(1, 4)),
                        "emotionalisation_affect_framing": int(rng.integers(3, 6)),
                        "appearance_objectification": int(rng.integers(4, 6)),
                    }
                )
    return pd.DataFrame(pm), pd.DataFrame(sc)
