"""F0 (component 'pitch' of the measure set): Praat's pitch track, with an optional octave check.

Measures: voiced_fraction (share of pitch frames that are voiced), f0_median_hz (Hz) and
f0_median_st (semitones re 100 Hz), medians over the voiced frames of the measured region
(voicebias.instruments.regions).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from voicebias.audio import AudioError
from voicebias.instruments.regions import region_mask
from voicebias.instruments.units import hz_to_semitones

#: the measures this component gives (voicebias.contract.MEASURE_COLUMNS)
MEASURES = ("voiced_fraction", "f0_median_hz", "f0_median_st")


def correct_octave_jumps(f0: np.ndarray, tolerance_st: float) -> tuple[np.ndarray, int]:
    """Fold pitch frames that sit one octave above or below the track's median (within
    `tolerance_st` semitones of +-12 st) back to the median's octave.

    f0 (Hz) of voiced frames. Returns the corrected f0 (Hz) and the number of frames
    moved. Halving and doubling are the errors a wide pitch range invites; a real
    octave jump of the voice is rare outside creak, which such a range is not used for.
    """
    f0 = np.asarray(f0, dtype=float).copy()
    st = 12.0 * np.log2(f0 / np.median(f0))
    up, down = np.abs(st - 12.0) < tolerance_st, np.abs(st + 12.0) < tolerance_st
    f0[up] /= 2.0
    f0[down] *= 2.0
    return f0, int(up.sum() + down.sum())


def measure(a: Any) -> dict[str, float]:
    """The pitch measures of the analysed signal `a` (voicebias.instruments.acoustics' shared analysis)."""
    _, voiced, _, f0_voiced = a.pitch()
    f0_med = float(np.median(f0_voiced))
    return {
        "voiced_fraction": float(voiced.mean()),
        "f0_median_hz": f0_med,
        "f0_median_st": float(hz_to_semitones(f0_med)),
    }


def pitch_track(snd, s) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(all frame times, voiced mask, voiced times, voiced f0 in Hz) of Praat's pitch track of `snd`
    with the settings `s` (time step, pitch floor and ceiling, octave check), the voiced frames
    those of the region `s.region`; AudioError when fewer than three frames are voiced."""
    pitch = snd.to_pitch(s.time_step, s.pitch_floor, s.pitch_ceiling)
    f0 = pitch.selected_array["frequency"]
    voiced = f0 > 0
    if voiced.sum() < 3:
        raise AudioError("no voiced frames found: silent, noise-only or non-speech audio", code="no_voicing")
    if s.region != "whole":
        voiced = region_mask(snd, pitch.xs(), voiced, s)
        if voiced.sum() < 3:
            raise AudioError(f"fewer than three voiced frames in the region '{s.region}'", code="no_voicing")
    f0_voiced = f0[voiced]
    if s.octave_check_st > 0:
        f0_voiced, _ = correct_octave_jumps(f0_voiced, s.octave_check_st)
    return (pitch.xs(), voiced, pitch.xs()[voiced], f0_voiced)
