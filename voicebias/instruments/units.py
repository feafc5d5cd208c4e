"""Unit conversions shared by the acoustic measures and the classifiers."""

from __future__ import annotations

import numpy as np


def hz_to_semitones(f_hz: float | np.ndarray, ref_hz: float = 100.0):
    """Semitones re `ref_hz` (12 per octave)."""
    return 12.0 * np.log2(np.asarray(f_hz, dtype=float) / ref_hz)
