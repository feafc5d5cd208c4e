"""Calibration of the SC voice-quality tests on simulated tables shaped like the real design.

Null: continuations keep their prompt's voice quality plus noise, no system
differences (1 to 4 systems; 30 prompts x 4 voices x 4 conditions). Every testable
type-III source term must reject at alpha .05 at most 8 % of the time, and each
gender x condition family of Tukey contrasts at most 8 % of the time (family-wise),
over 200-500 datasets per number of systems (SLOW_NULL_DATASETS).
Planted: retention 0.3 (female) / 0.7 (male) of the condition shift and system
offsets; the 95 % intervals of the contrasts must cover the planted differences
92-98 % of the time. The full study is marked slow (``pytest -m slow``); the default
run has a reduced version of each.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.support.sc_design import planted_contrast, simulate_vq
from voicebias.analysis.sc_stats import voice_quality_models

OFFSETS = (0.0, 0.5, -0.4, 0.3)
RETENTION = {"female": 0.3, "male": 0.7}


def null_rates(n_systems: int, n_datasets: int, seed0: int = 0) -> tuple[pd.Series, float, int]:
    """Rejection rate at .05 per testable type-III source term, the family-wise Tukey rate,
    and the number of families, over n_datasets null tables."""
    rejected: dict[str, list[bool]] = {}
    families = []
    for i in range(n_datasets):
        res = voice_quality_models(
            simulate_vq(n_systems, seed=seed0 + 7919 * n_systems + i), measures=["h1_h2_db"], prompts_random=False
        )
        t3 = res["type3"]
        for r in t3[(t3["model"] == "continuation - prompt") | (t3["term"] == "voice_gender:phonation")].itertuples():
            if r.testable:
                rejected.setdefault(r.term, []).append(bool(r.p_value < 0.05))
        c = res["contrasts"]
        c = c[c["testable"]]
        families += list(c.groupby(["voice_gender", "phonation"])["p_tukey"].min().lt(0.05))
    rates = pd.Series({t: float(np.mean(v)) for t, v in rejected.items()})
    return rates, float(np.mean(families)), len(families)


def coverage(n_systems: int, n_datasets: int, seed0: int = 0) -> tuple[float, int]:
    """Share of 95 % contrast intervals covering the planted difference, and their number."""
    hits = []
    for i in range(n_datasets):
        vq = simulate_vq(
            n_systems,
            seed=seed0 + 104729 * n_systems + i,
            retention=RETENTION,
            system_offsets=OFFSETS[:n_systems],
            voice_shift_sd=0.0,
        )
        c = voice_quality_models(vq, measures=["h1_h2_db"], prompts_random=False)["contrasts"]
        off = {f"sys{k + 1}": OFFSETS[k] for k in range(n_systems)}
        for r in c.itertuples():
            truth = planted_contrast(r.voice_gender, r.phonation, RETENTION, off[r.level_a])
            if r.level_b != "prompt":
                truth = off[r.level_a] - off[r.level_b]
            hits.append(r.ci_low <= truth <= r.ci_high)
    return float(np.mean(hits)), len(hits)


@pytest.mark.parametrize("n_systems", [1, 2])
def test_null_false_positive_rate_reduced(n_systems):
    n = 40 if n_systems == 1 else 30
    rates, family_rate, _ = null_rates(n_systems, n)
    assert len(rates) >= 3
    # 30-40 datasets: Monte-Carlo SE of a rate near .05 is about .035, so the reduced run bounds the mean over
    # terms and the Tukey family rate at .10 (the pseudo-replicated model rejected 17-30 %), each term at .30
    assert rates.mean() <= 0.10, rates
    assert rates.max() <= 0.3, rates
    assert family_rate <= 0.10


def test_planted_contrasts_are_covered_reduced():
    cov, n = coverage(2, 10)
    assert n == 10 * 8 * 3
    assert 0.92 <= cov <= 0.98


SLOW_NULL_DATASETS = {1: 200, 2: 200, 3: 500, 4: 300}
SLOW_COVERAGE_DATASETS = 40


@pytest.mark.slow
@pytest.mark.parametrize("n_systems", [1, 2, 3, 4])
def test_null_false_positive_rate(n_systems):
    rates, family_rate, _ = null_rates(n_systems, SLOW_NULL_DATASETS[n_systems], seed0=1)
    assert (rates <= 0.08).all(), rates
    assert family_rate <= 0.08


@pytest.mark.slow
@pytest.mark.parametrize("n_systems", [1, 2, 3, 4])
def test_planted_contrasts_are_covered(n_systems):
    cov, _ = coverage(n_systems, SLOW_COVERAGE_DATASETS, seed0=1)
    assert 0.92 <= cov <= 0.98
