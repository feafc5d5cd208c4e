"""Decisions that do not hinge on the last bits of a computation.

A table's categories (constant measure, no residual variance, singular fit, converged) are decided
with a margin, so that the same data computed by another BLAS kernel, or perturbed by 1e-9 of its
values, falls on the same side of every switch: a spread is *negligible* below ``REL_SPREAD`` times
the values' magnitude or below ``ABS_SPREAD``, and a fit is singular when a random-effect SD is
below ``SINGULAR_THETA`` times the residual SD (lme4's ``isSingular`` tolerance).

The margins and why they are safe: docs/reproducibility.md, "Decisions with a margin".
"""

from __future__ import annotations

import numpy as np

REL_SPREAD = 1e-7
ABS_SPREAD = 1e-12
SINGULAR_THETA = 1e-4


def magnitude(values) -> float:
    """The largest absolute finite value (0 for none)."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    return float(np.max(np.abs(v))) if v.size else 0.0


def negligible(spread: float, scale: float) -> bool:
    """Whether `spread` (a standard deviation, a range) is rounding next to values of size `scale`."""
    return bool(abs(spread) <= max(REL_SPREAD * abs(scale), ABS_SPREAD))


def is_constant(values) -> bool:
    """Whether `values` are one number up to rounding (their range is negligible next to their size)."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    return v.size == 0 or negligible(float(np.ptp(v)), magnitude(v))


def singular_ratio(ratio: float) -> bool:
    """Whether a variance ratio s2_group / s2_residual is at its boundary (theta = sqrt(ratio) < 1e-4)."""
    return bool(ratio < SINGULAR_THETA**2)
