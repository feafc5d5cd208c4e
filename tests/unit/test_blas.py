"""One BLAS thread for the statistical fits (voicebias.blas): inside the block every loaded BLAS
runs on one thread, the process's setting comes back after it (also after an exception and after
nested blocks), and the fitting engines run inside it."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg  # noqa: F401  (both BLAS libraries loaded)
from threadpoolctl import ThreadpoolController, threadpool_limits

from voicebias.blas import one_blas_thread, single_blas_thread


def blas_threads() -> set[int]:
    return {lib["num_threads"] for lib in ThreadpoolController().info() if lib["user_api"] == "blas"}


def test_the_block_runs_on_one_thread_and_restores_the_setting_after_nesting_and_errors():
    with threadpool_limits(limits=2, user_api="blas"):
        assert blas_threads() == {2}
        with one_blas_thread():
            assert blas_threads() == {1}
            with one_blas_thread():
                assert blas_threads() == {1}
            assert blas_threads() == {1}  # the inner block does not restore the outer one's limit
        assert blas_threads() == {2}
        with pytest.raises(ZeroDivisionError), one_blas_thread():
            1 / 0
        assert blas_threads() == {2}


def test_the_fitting_engines_run_on_one_thread(monkeypatch):
    from voicebias.analysis import mixed

    seen = []

    @single_blas_thread
    def probe():
        seen.append(blas_threads())
        return 7

    assert probe() == 7 and seen == [{1}]
    # fit_reml_matrices is wrapped: the optimiser's objective sees one thread
    real = mixed._reml_objective

    def objective(gamma, D):
        seen.append(blas_threads())
        return real(gamma, D)

    monkeypatch.setattr(mixed, "_reml_objective", objective)
    rng = np.random.default_rng(1)
    groups = np.repeat(np.arange(8), 5)
    y = rng.normal(size=8)[groups] + rng.normal(size=40)
    with threadpool_limits(limits=2, user_api="blas"):
        mixed.fit_reml_matrices(y, np.ones((40, 1)), ["(Intercept)"], {"g": groups})
    assert len(seen) > 2 and all(s == {1} for s in seen)
