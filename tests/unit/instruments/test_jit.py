"""The instrument's compiled loops: NumPy's summation order, and IEEE arithmetic."""

import numpy as np
import pytest

from voicebias.instruments.jit import pairwise_sum


@pytest.mark.parametrize("n", [1, 5, 8, 9, 127, 128, 129, 1000, 1001, 4097])
def test_pairwise_sum_adds_as_numpy_does(n):
    """pairwise_sum gives numpy.sum's float bit for bit (so a mean built on it is
    numpy.mean's), from any start."""
    x = np.random.default_rng(n).standard_normal(n + 17) * 1e3 + 1e-3
    for start in (0, 3, 17):
        assert pairwise_sum(x, start, n) == np.sum(x[start : start + n])
        assert pairwise_sum(x, start, n) / n == np.mean(x[start : start + n])
