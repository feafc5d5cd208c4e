"""Decisions that do not hinge on the last bits of a computation.

A table's categories (constant measure, no residual variance, singular fit, converged) are
decided with a margin, so that the same data computed by another BLAS kernel, or perturbed
by 1e-9 of its values, falls on the same side of every switch:

- a spread is *negligible* when it is at most ``REL_SPREAD`` (1e-7) times the magnitude of
  the values it is a spread of: rounding in an output - control difference, or in a sum of
  a few hundred terms, stays near 1e-15 of that magnitude, far below the margin, and a
  real measure that varies by less than 1e-7 of its size carries no information a test
  could use; a spread of at most ``ABS_SPREAD`` (1e-12, in the measure's own units:
  semitones, SD, octaves, logits) is rounding whatever the values' size (an output - control
  difference of two equal measures);
- a random-effect standard deviation is *at its boundary* (a singular fit) when its ratio to
  the residual standard deviation is below ``SINGULAR_THETA`` (1e-4), lme4's default
  tolerance in ``isSingular`` (lme4 reference manual, ``isSingular``).
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
