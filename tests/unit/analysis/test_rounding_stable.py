"""Verdicts that do not hinge on the last bits: the SC mixed models' convergence flags and
statuses are the same when every measure is perturbed by 1e-9 relative (what another
processor's kernels do to the inputs of a fit)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.support.sc_design import simulate_vq
from voicebias.analysis.mixed import GRADIENT_TOL, _at_optimum, _reml_objective, fit_reml
from voicebias.analysis.sc_stats import voice_quality_models

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
    D = fit.design
    gamma = np.array([fit.vcomp["voice"] / fit.vcomp["residual"]])
    assert _at_optimum(gamma, D, bounded=True)
    # a search stopped at a tenth of the optimum's variance ratio is not an optimum
    far = gamma * 0.1 if gamma[0] > 1e-6 else np.array([1.0])
    slope = (_reml_objective(far * 1.0001, D) - _reml_objective(far / 1.0001, D)) / 2e-4
    assert abs(slope) > GRADIENT_TOL and not _at_optimum(far, D, bounded=True)


def _cells(seed: int, noise: float = 0.3):
    vq = simulate_vq(1, prompts=8, seed=seed, noise=noise)
    cells = vq[vq["system"].isna()] if "system" in vq else vq
    cells = cells.groupby(["voice_id", "voice_gender", "phonation"], as_index=False)["h1_h2_db"].mean()
    return cells.rename(columns={"h1_h2_db": "y"})


def test_the_analytic_reml_derivatives_are_the_deviances():
    from voicebias.analysis.mixed import _reml_derivatives

    cells = _cells(3)
    fit = fit_reml("y ~ C(voice_gender, Sum) * C(phonation, Sum)", cells, {"voice": cells["voice_id"]})
    D = fit.design
    for gamma in (np.array([0.3]), np.array([2.0]), np.array([17.0])):
        grad, hess = _reml_derivatives(gamma, D)
        h = 1e-5 * gamma[0]
        up, down = _reml_objective(gamma + h, D), _reml_objective(gamma - h, D)
        assert grad[0] == pytest.approx((up - down) / (2 * h), rel=1e-6, abs=1e-8)
        g_up, _ = _reml_derivatives(gamma + h, D)
        g_down, _ = _reml_derivatives(gamma - h, D)
        assert hess[0, 0] == pytest.approx((g_up[0] - g_down[0]) / (2 * h), rel=1e-5)


@pytest.mark.parametrize("seed, noise", [(3, 0.3), (11, 0.05)])
def test_the_polished_optimum_is_the_same_from_wherever_the_search_stopped(seed, noise):
    """Two searches that stop 1e-4 apart (another machine's line search) polish to the same
    variance ratio, to rounding, where the deviance's slope is rounding too."""
    from voicebias.analysis.mixed import _polish, _reml_derivatives

    cells = _cells(seed, noise)
    fit = fit_reml("y ~ C(voice_gender, Sum) * C(phonation, Sum)", cells, {"voice": cells["voice_id"]})
    D = fit.design
    gamma = np.array([fit.vcomp["voice"] / fit.vcomp["residual"]])
    assert gamma[0] > 0
    a = _polish(gamma * (1 + 1e-4), D, bounded=True)
    b = _polish(gamma * (1 - 1e-4), D, bounded=True)
    assert a[0] == pytest.approx(b[0], rel=1e-11) and a[0] == pytest.approx(gamma[0], rel=1e-9)
    assert abs(_reml_derivatives(a, D)[0][0]) * a[0] < 1e-8
