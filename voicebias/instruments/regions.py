"""The stretch of a signal the measures are taken over (`MeasureSettings.region`).

The pitch track is computed on the whole signal; a region keeps the voiced frames inside it, so
every measure (each a median over voiced frames) is taken there, with the whole signal as context.

- ``whole``: every voiced frame (the default).
- ``voiced``: voiced frames within NUCLEUS_DB of the loudest voiced frame (weak voicing left out).
- ``nucleus``: the longest run of such frames (gaps up to MAX_GAP_S bridged): one vowel's nucleus.
- ``steady``: the first STEADY_FRACTION of the nucleus, before the transition into what follows it.
- ``span:<start>:<end>``: the frames between two times in seconds, e.g. a TextGrid interval.

See docs/accuracy.md, "Measuring part of a file".
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from voicebias.audio import AudioError

#: the region kinds a signal can be measured over (`span:<start>:<end>` besides)
KINDS = ("whole", "voiced", "nucleus", "steady")
#: intensity below the loudest voiced frame (dB) under which voicing is left out of voiced/nucleus
NUCLEUS_DB = 6.0
#: gaps of at most this long (s) inside the nucleus are bridged
MAX_GAP_S = 0.03
#: the share of the nucleus, from its start, taken as its steady part
STEADY_FRACTION = 0.5


def parse(region: str) -> tuple[str, float, float]:
    """(kind, start s, end s) of a region setting; start and end are NaN except for spans.
    ValueError for anything else."""
    if region in KINDS:
        return region, math.nan, math.nan
    if isinstance(region, str) and region.startswith("span:"):
        try:
            start, end = (float(v) for v in region[len("span:") :].split(":"))
        except ValueError:
            start = end = math.nan
        if math.isfinite(start) and math.isfinite(end) and 0 <= start < end:
            return "span", start, end
        raise ValueError(f"a span region is 'span:<start>:<end>' with 0 <= start < end in seconds, not '{region}'")
    raise ValueError(f"region must be one of {', '.join(KINDS)} or 'span:<start>:<end>', not '{region}'")


def span(start: float, end: float) -> str:
    """The region setting of the stretch from `start` to `end` seconds."""
    region = f"span:{float(start)!r}:{float(end)!r}"
    parse(region)
    return region


def _runs(keep: np.ndarray, max_gap: int) -> list[tuple[int, int]]:
    """(first, last) frame indices of the runs of `keep`, gaps of up to `max_gap` frames bridged."""
    idx = np.flatnonzero(keep)
    if idx.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(idx) > max_gap + 1)
    starts = np.concatenate([[idx[0]], idx[breaks + 1]])
    ends = np.concatenate([idx[breaks], [idx[-1]]])
    return list(zip(starts.tolist(), ends.tolist()))


def _intensity_at(snd, times: np.ndarray, s: Any) -> np.ndarray:
    """Praat's intensity (dB) at `times`, with the pitch floor as its minimum pitch."""
    intensity = snd.to_intensity(minimum_pitch=s.pitch_floor, time_step=s.time_step, subtract_mean=False)
    return np.interp(times, intensity.xs(), intensity.values[0])


def _steady(frames: np.ndarray) -> np.ndarray:
    """The first STEADY_FRACTION of the nucleus frames (at least three)."""
    return frames[: max(3, int(math.ceil(STEADY_FRACTION * frames.size)))]


def region_mask(snd, times: np.ndarray, voiced: np.ndarray, s: Any) -> np.ndarray:
    """The voiced frames (mask over the pitch frames at `times`) inside the region `s.region`.
    AudioError (no_voicing) when the region holds no voiced frame."""
    kind, start, end = parse(s.region)
    if kind == "whole":
        return voiced
    if kind == "span":
        keep = voiced & (times >= start) & (times <= end)
        if not keep.any():
            raise AudioError(f"no voiced frames between {start:g} and {end:g} s", code="no_voicing")
        return keep
    level = _intensity_at(snd, times, s)
    keep = voiced & (level >= level[voiced].max() - NUCLEUS_DB)
    if kind == "voiced":
        return keep
    runs = _runs(keep, int(round(MAX_GAP_S / s.time_step)))
    first, last = max(runs, key=lambda r: (r[1] - r[0], -r[0]))
    frames = np.arange(first, last + 1)
    frames = frames[voiced[frames]]
    if kind == "steady":
        frames = _steady(frames)
    out = np.zeros_like(voiced)
    out[frames] = True
    return out


def textgrid_intervals(path: str | Path, tier: str) -> list[tuple[str, float, float]]:
    """(label, start s, end s) of every labelled interval of the interval tier `tier` in a Praat
    TextGrid (read by Praat itself, any of its text formats), in time order; intervals whose label
    is empty or blank are skipped. ConfigError for a file Praat cannot read or a missing tier."""
    import parselmouth
    from parselmouth.praat import call

    from voicebias.errors import ConfigError

    try:
        grid = parselmouth.read(str(path))
        names = [call(grid, "Get tier name", i) for i in range(1, call(grid, "Get number of tiers") + 1)]
    except parselmouth.PraatError as exc:
        raise ConfigError(f"{path}: not a TextGrid Praat can read ({' '.join(str(exc).split())})") from None
    if tier not in names:
        raise ConfigError(f"{path}: no tier '{tier}' (tiers: {', '.join(names) or 'none'})")
    number = names.index(tier) + 1
    if not call(grid, "Is interval tier", number):
        raise ConfigError(f"{path}: tier '{tier}' is a point tier; give an interval tier")
    out = []
    for j in range(1, call(grid, "Get number of intervals", number) + 1):
        label = call(grid, "Get label of interval", number, j)
        if label.strip():
            out.append(
                (
                    label,
                    float(call(grid, "Get start time of interval", number, j)),
                    float(call(grid, "Get end time of interval", number, j)),
                )
            )
    return out
