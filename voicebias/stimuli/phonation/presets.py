"""Phonation presets as per-frame voice-quality conditioning (SC paper, sec. 2.1).

VoiceQualityVC (Hfkml/VQVC) conditions a conversion on six voice-quality features per 20 ms frame,
in standard-deviation units (FEATURES: creak, CPPS, H1-H2, pitch, H1-A3, pitch variance). The SC
paper's presets (breathy, creaky, endcreak) live in params.yaml (`phonation.presets`); both
converters read the same arrays, so a preset means one thing across backends. `conditioning` turns
one into an (n_frames, 6) array of offsets in SD units.

The presets' values: docs/phonation.md, "Presets".
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from voicebias.contract import CONDITIONS
from voicebias.errors import ConfigError

FEATURES = ("creak", "cpps", "h1_h2", "pitch", "h1_a3", "pitch_var")
FRAME_S = 0.02

PAPER_PRESETS: dict[str, dict[str, Any]] = {
    "modal": {"shape": "constant", "targets": {}},
    "breathy": {"shape": "constant", "targets": {"h1_h2": 3.0, "h1_a3": 3.0, "creak": -2.0, "cpps": -1.0}},
    "creaky": {"shape": "constant", "targets": {"creak": 2.0, "cpps": -1.5, "h1_h2": -2.0, "h1_a3": -2.0}},
    "endcreak": {"shape": "ramp", "start": 0.5, "targets": {"creak": 7.0, "h1_h2": -2.0, "h1_a3": -2.0, "cpps": -2.0}},
}


def check_preset(name: str, preset: Mapping[str, Any]) -> None:
    """Raise ValueError naming what is wrong with one preset."""
    shape = preset.get("shape", "constant")
    if shape not in ("constant", "ramp"):
        raise ConfigError(f"phonation preset '{name}': shape must be 'constant' or 'ramp', not {shape!r}")
    targets = preset.get("targets") or {}
    unknown = sorted(set(targets) - set(FEATURES))
    if unknown:
        raise ConfigError(f"phonation preset '{name}': unknown feature(s) {unknown}; expected some of {list(FEATURES)}")
    for k, v in targets.items():
        if not isinstance(v, (int, float)) or not np.isfinite(v):
            raise ConfigError(f"phonation preset '{name}': {k} must be a finite number of SD units, not {v!r}")
    if shape == "ramp":
        start = preset.get("start", 0.5)
        if not isinstance(start, (int, float)) or not 0.0 <= start < 1.0:
            raise ConfigError(f"phonation preset '{name}': ramp start must be a fraction in [0, 1), not {start!r}")


def n_frames(duration_s: float, frame_s: float = FRAME_S) -> int:
    """Frames of frame_s covering duration_s (at least one)."""
    if not duration_s > 0:
        raise ValueError(f"duration must be positive, not {duration_s}")
    return max(1, int(np.ceil(duration_s / frame_s - 1e-9)))


def ramp_weights(frames: int, start: float) -> np.ndarray:
    """0 before frame index floor(start * frames), then linear to 1 at the last frame."""
    w = np.zeros(frames)
    i0 = int(np.floor(start * frames))
    span = frames - 1 - i0
    if span <= 0:
        w[i0:] = 1.0
    else:
        w[i0:] = np.arange(span + 1) / span
    return w


def conditioning(preset: Mapping[str, Any], frames: int, name: str = "preset") -> np.ndarray:
    """(frames, len(FEATURES)) offsets in SD units, columns in FEATURES order."""
    check_preset(name, preset)
    if frames < 1:
        raise ValueError(f"need at least one frame, not {frames}")
    out = np.zeros((frames, len(FEATURES)))
    shape = preset.get("shape", "constant")
    w = np.ones(frames) if shape == "constant" else ramp_weights(frames, float(preset.get("start", 0.5)))
    for k, v in (preset.get("targets") or {}).items():
        out[:, FEATURES.index(k)] = float(v) * w
    return out


def presets_from_params(params: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The presets in params (phonation.presets), checked; the paper's when absent."""
    presets = dict((params or {}).get("presets") or PAPER_PRESETS)
    missing = [c for c in CONDITIONS if c not in presets]
    if missing:
        raise ConfigError(f"phonation.presets lacks condition(s) {missing}; expected {list(CONDITIONS)}")
    for k, v in presets.items():
        if k not in CONDITIONS:
            raise ConfigError(f"phonation.presets: unknown condition '{k}'; expected {list(CONDITIONS)}")
        check_preset(k, v)
    return presets
