"""Verdicts that do not hinge on the last bits: the SC mixed models' convergence flags and
statuses are the same when every measure is perturbed by 1e-9 relative (what another
processor's kernels do to the inputs of a fit)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tests.sc_design import simulate_vq
from voicebias.analysis.sc_stats import GRADIENT_TOL, _at_optimum, _reml_objective, fit_reml, voice_quality_models

CATEGORIES = ["measure", "model", "n_cells", "n_obs", "converged", "status", "reason"]


def perturbed(vq: pd.DataFrame, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    out = vq.copy()
    out["h1_h2_db"] = out["h1_h2_db"] * (1 + 1e-9 * rng.choice([-1.0, 1.0], len(out)))
    return out


def test_sc_fit_verdicts_survive_a_1e_9_perturbation_of_every_input():
    tables = [simulate_vq(1, prompts=8, seed=s) for s in range(4)]
    # and the ill-conditioned case: voices far apart against a small residual (variance ratio ~ 500)
    tables.append(simulate_vq(1, prompts=8, seed=11, noise=0.05))
    flags = []
    for vq in tables:
        base = voice_quality_models(vq, measures=["h1_h2_db"])["fits"][CATEGORIES]
        flags += list(base["converged"])
        for seed in range(3):
            again = voice_quality_models(perturbed(vq, seed), measures=["h1_h2_db"])["fits"][CATEGORIES]
            pd.testing.assert_frame_equal(base, again)
    assert all(flags)  # these designs have a located optimum; the flag says so on every run


def test_the_convergence_flag_reads_the_deviance_where_the_search_ended():
    vq = simulate_vq(1, prompts=8, seed=3)
    cells = vq[vq["system"].isna()] if "system" in vq else vq
    cells = cells.groupby(["voice_id", "voice_gender", "phonation"], as_index=False)["h1_h2_db"].mean()
    cells = cells.rename(columns={"h1_h2_db": "y"})
    fit = fit_reml("y ~ C(voice_gender, Sum) * C(phonation, Sum)", cells, {"voice": cells["voice_id"]})
    assert fit.converged
    y, X = fit.y, fit.X
    Gs = list(fit.G.values())
    gamma = np.array([fit.vcomp["voice"] / fit.vcomp["residual"]])
    assert _at_optimum(gamma, y, X, Gs, bounded=True)
    # a search stopped at a tenth of the optimum's variance ratio is not an optimum
    far = gamma * 0.1 if gamma[0] > 1e-6 else np.array([1.0])
    slope = (_reml_objective(far * 1.0001, y, X, Gs) - _reml_objective(far / 1.0001, y, X, Gs)) / 2e-4
    assert abs(slope) > GRADIENT_TOL and not _at_optimum(far, y, X, Gs, bounded=True)
