"""Phonation conversion: breathy, creaky and end-creak versions of each modal prompt.

Two converters read the same per-frame conditioning (voicebias.stimuli.phonation.presets, SD units
per 20 ms frame): ``parametric`` (embedded default), signal processing with Praat (parselmouth),
numpy and scipy in three steps (creak by PSOLA with jitter and alternating pulses, spectral tilt
by an STFT gain and a high shelf, aspiration noise), each SD unit given a physical size by
`ParametricSettings` (``phonation.parametric``); and ``vqvc``, VoiceQualityVC in its own
environment (voicebias.stimuli.phonation.vqvc). The stage writes data/phonation/manifest.csv and
the converted audio.

The three steps and their settings: docs/phonation.md, "The parametric converter".
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import os
import shutil
import tempfile
from collections import OrderedDict
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import parselmouth
from parselmouth.praat import call
from scipy import signal

from voicebias.errors import ConfigError, StageFailed
from voicebias.registry import Registry
from voicebias.stimuli.phonation.presets import FEATURES, FRAME_S, conditioning, n_frames
from voicebias.stimuli.selection import selected_prompt_ids


@dataclass(frozen=True)
class ParametricSettings:
    """Physical size of one SD unit of each conditioning feature (see module docstring)."""

    creak_semitones_per_sd: float = 0.8
    jitter_per_sd: float = 0.01
    jitter_per_cpps_sd: float = 0.005
    max_jitter: float = 0.03
    alternation_per_sd: float = 0.1
    max_alternation: float = 0.8
    tilt_db_per_octave_per_sd: float = 1.0
    tilt_reference_hz: float = 50.0
    tilt_max_hz: float = 600.0
    shelf_db_per_sd: float = 1.0
    shelf_hz: float = 2000.0
    aspiration_per_sd: float = 0.05
    noise_highpass_hz: float = 500.0
    stft_frame_s: float = 0.03
    stft_hop_s: float = 0.01

    @classmethod
    def from_params(cls, p: dict[str, Any] | None) -> "ParametricSettings":
        p = dict(p or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(p) - known)
        if unknown:
            raise ConfigError(f"phonation.parametric: unknown setting(s) {unknown}; known: {sorted(known)}")
        return cls(**{k: float(v) for k, v in p.items()})


def _at(cond: np.ndarray, feature: str, times: np.ndarray) -> np.ndarray:
    """Conditioning value of one feature at arbitrary times (s), linear between frame centres."""
    col = cond[:, FEATURES.index(feature)]
    centres = (np.arange(len(col)) + 0.5) * FRAME_S
    return np.interp(times, centres, col)


# PitchTiers pass between Praat and Python as Praat text files, not point by point
# (one Praat command per period was most of a conversion's time): Praat writes every
# number so that it reads back as the same double, and Python's repr does too, so the
# points and the values between them are the ones Praat's own commands give.

_PITCH_TIER_HEAD = ['File type = "ooTextFile"', 'Object class = "PitchTier"', ""]


def _read_pitch_tier(tier: Any, path: Path) -> tuple[float, float, list[float], list[float]]:
    """(start time, end time, point times, point values) of a Praat PitchTier."""
    call(tier, "Save as short text file", str(path))
    lines = path.read_text(encoding="utf-8").split("\n")
    if lines[:3] != _PITCH_TIER_HEAD:
        raise StageFailed(f"unexpected Praat PitchTier text file: {lines[:3]}")
    n = int(lines[5])
    numbers = [float(v) for v in lines[6 : 6 + 2 * n]]
    return float(lines[3]), float(lines[4]), numbers[0::2], numbers[1::2]


def _write_pitch_tier(path: Path, start: float, end: float, times: list[float], values: list[float]) -> Any:
    """A Praat PitchTier with these points (times increasing), read from a text file."""
    lines = _PITCH_TIER_HEAD + [repr(float(start)), repr(float(end)), str(len(times))]
    for t, v in zip(times, values):
        lines += [repr(float(t)), repr(float(v))]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return parselmouth.read(str(path))


def _pitch_tier_value(times: list[float], values: list[float], t: float) -> float:
    """A PitchTier's value at time t as Praat's Get value at time gives it: the first or
    last point's value outside the points, linear between the two points around t."""
    if t <= times[0]:
        return values[0]
    if t >= times[-1]:
        return values[-1]
    i = bisect.bisect_right(times, t) - 1
    t_left, f_left, t_right, f_right = times[i], values[i], times[i + 1], values[i + 1]
    if t == t_right:
        return f_right
    if t_left == t_right:
        return 0.5 * (f_left + f_right)
    return f_left + (t - t_left) * (f_right - f_left) / (t_right - t_left)


#: Manipulations computed in this process: (samples digest, length, rate, floor, ceiling) -> Manipulation
_MANIPULATIONS: "OrderedDict[tuple, Any]" = OrderedDict()
_MANIPULATIONS_KEPT = 4


def _manipulation(snd: parselmouth.Sound, floor: float, ceiling: float) -> Any:
    """A fresh copy of Praat's Manipulation of `snd` (To Manipulation, 10 ms steps).

    The analysis depends on the samples and the pitch range alone, so it is made once
    per recording and range and copied for each use: the creaky and end-creak versions
    of one recording start from the same Manipulation (each copy is then changed)."""
    values = snd.values
    key = (
        hashlib.sha256(values.tobytes()).digest(),
        values.shape,
        float(snd.sampling_frequency),
        float(floor),
        float(ceiling),
    )
    manip = _MANIPULATIONS.get(key)
    if manip is None:
        manip = _MANIPULATIONS[key] = call(snd, "To Manipulation", 0.01, floor, ceiling)
        while len(_MANIPULATIONS) > _MANIPULATIONS_KEPT:
            _MANIPULATIONS.popitem(last=False)
    else:
        _MANIPULATIONS.move_to_end(key)
    return call(manip, "Copy", "manipulation")


def _creak(
    x: np.ndarray,
    sr: int,
    cond: np.ndarray,
    floor: float,
    ceiling: float,
    s: ParametricSettings,
    rng: np.random.Generator,
) -> np.ndarray:
    """Lowered, jittered F0 (PSOLA) and alternating pulse amplitudes where creak > 0."""
    snd = parselmouth.Sound(x.astype(np.float64), sampling_frequency=sr)
    manip = _manipulation(snd, floor, ceiling)
    workdir = tempfile.mkdtemp(prefix="voicebias-creak-")
    try:
        return _creak_with_tiers(x, sr, cond, floor, ceiling, s, rng, snd, manip, Path(workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _creak_with_tiers(
    x: np.ndarray,
    sr: int,
    cond: np.ndarray,
    floor: float,
    ceiling: float,
    s: ParametricSettings,
    rng: np.random.Generator,
    snd: parselmouth.Sound,
    manip: Any,
    workdir: Path,
) -> np.ndarray:
    start, end, tier_times, tier_values = _read_pitch_tier(call(manip, "Extract pitch tier"), workdir / "old.PitchTier")
    n_points = len(tier_times)
    if n_points < 2:
        return x.copy()  # nothing voiced to make creaky
    t_first = tier_times[0]
    t_last = tier_times[-1]
    # One point per new period: walk the contour period by period.
    times, freqs = [], []
    t = t_first
    while t <= t_last:
        f = _pitch_tier_value(tier_times, tier_values, t)
        creak = max(0.0, float(_at(cond, "creak", np.array([t]))[0]))
        cpps = float(_at(cond, "cpps", np.array([t]))[0])
        jit = s.jitter_per_sd * creak + (s.jitter_per_cpps_sd * max(0.0, -cpps) if creak > 0 else 0.0)
        jit = min(jit, s.max_jitter)
        f_new = f * 2.0 ** (-s.creak_semitones_per_sd * creak / 12.0) * float(np.exp(jit * rng.standard_normal()))
        f_new = float(np.clip(f_new, 0.6 * floor, ceiling))
        times.append(t)
        freqs.append(f_new)
        t += 1.0 / f_new
    tier = _write_pitch_tier(workdir / "new.PitchTier", start, end, times, freqs)
    call([tier, manip], "Replace pitch tier")
    y = call(manip, "Get resynthesis (overlap-add)").values[0]
    y = np.asarray(y[: len(x)], dtype=np.float64)
    if len(y) < len(x):
        y = np.pad(y, (0, len(x) - len(y)))
    # Alternating amplitudes, period by period, with 1 ms cross-fades between periods.
    pts = np.asarray(times)
    depth = np.minimum(s.alternation_per_sd * np.maximum(_at(cond, "creak", pts), 0.0), s.max_alternation)
    gain_at_point = 1.0 - depth * (np.arange(len(pts)) % 2)
    n = np.arange(len(y)) / sr
    idx = np.clip(np.searchsorted(pts, n, side="right") - 1, 0, len(pts) - 1)
    g = gain_at_point[idx]
    g[n < pts[0]] = 1.0
    k = max(1, int(round(0.001 * sr)))
    g = np.convolve(g, np.ones(k) / k, mode="same")
    y = y * g
    # Outside creak the original samples are kept (PSOLA would re-place every pulse),
    # with a 20 ms cross-fade where creak begins or ends.
    inside = (_at(cond, "creak", n) > 0).astype(float)
    k = max(1, int(round(0.02 * sr)))
    w = np.clip(np.convolve(np.pad(inside, k, mode="edge"), np.ones(k) / k, mode="same")[k:-k], 0.0, 1.0)
    return w * y + (1.0 - w) * x


def _tilt(x: np.ndarray, sr: int, cond: np.ndarray, s: ParametricSettings) -> np.ndarray:
    """Zero-phase, time-varying spectral tilt and high shelf (STFT gain)."""
    h1h2 = cond[:, FEATURES.index("h1_h2")]
    h1a3 = cond[:, FEATURES.index("h1_a3")]
    if not (np.any(h1h2) or np.any(h1a3)):
        return x.copy()
    nper = int(round(s.stft_frame_s * sr))
    hop = int(round(s.stft_hop_s * sr))
    f, t, Z = signal.stft(x, fs=sr, window="hann", nperseg=nper, noverlap=nper - hop, boundary="even", padded=True)
    octaves = np.log2(np.clip(f, s.tilt_reference_hz, s.tilt_max_hz) / s.tilt_reference_hz)
    shelf = np.clip((f - 0.5 * s.shelf_hz) / (0.5 * s.shelf_hz), 0.0, 1.0)
    shelf = 0.5 - 0.5 * np.cos(np.pi * shelf)  # raised-cosine rise from shelf_hz/2 to shelf_hz
    a = s.tilt_db_per_octave_per_sd * _at(cond, "h1_h2", t)
    b = s.shelf_db_per_sd * _at(cond, "h1_a3", t)
    gain_db = -(octaves[:, None] * a[None, :]) - (shelf[:, None] * b[None, :])
    _, y = signal.istft(
        Z * 10.0 ** (gain_db / 20.0), fs=sr, window="hann", nperseg=nper, noverlap=nper - hop, boundary=True
    )
    y = np.asarray(y[: len(x)], dtype=np.float64)
    return np.pad(y, (0, len(x) - len(y))) if len(y) < len(x) else y


def _aspiration(
    x: np.ndarray, sr: int, cond: np.ndarray, s: ParametricSettings, rng: np.random.Generator
) -> np.ndarray:
    """x plus envelope-shaped high-passed noise where CPPS < 0 and creak <= 0."""
    n = np.arange(len(x)) / sr
    level = s.aspiration_per_sd * np.maximum(-_at(cond, "cpps", n), 0.0) * (_at(cond, "creak", n) <= 0)
    if not np.any(level > 0):
        return x
    sos = signal.butter(4, s.noise_highpass_hz, btype="highpass", fs=sr, output="sos")
    noise = signal.sosfiltfilt(sos, rng.standard_normal(len(x)))
    noise /= np.sqrt(np.mean(noise**2)) + 1e-12
    k = max(1, int(round(0.02 * sr)))
    env = np.sqrt(np.convolve(x**2, np.ones(k) / k, mode="same"))
    return x + level * env * noise


def convert_parametric(
    x: np.ndarray,
    sr: int,
    cond: np.ndarray,
    pitch_floor: float,
    pitch_ceiling: float,
    settings: ParametricSettings | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Apply one conditioning array (n_frames x 6, SD units) to a mono signal.

    Returns the converted signal (same length and RMS as x) and notes:
    `peak_limited` (True when the RMS match had to be reduced to stay below full scale).
    """
    s = settings or ParametricSettings()
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError("phonation conversion needs a non-empty mono signal")
    rng = np.random.default_rng(seed)
    y = x
    if np.any(cond[:, FEATURES.index("creak")] > 0):
        y = _creak(y, sr, cond, pitch_floor, pitch_ceiling, s, rng)
    y = _tilt(y, sr, cond, s)
    y = _aspiration(y, sr, cond, s, rng)
    rms_x = np.sqrt(np.mean(x**2))
    rms_y = np.sqrt(np.mean(y**2))
    y = y * (rms_x / rms_y if rms_y > 0 else 1.0)
    peak = float(np.max(np.abs(y)))
    limited = peak > 0.99
    if limited:
        y = y * (0.99 / peak)
    return y.astype(np.float32), {"peak_limited": bool(limited)}


# ------------------------------------------------------------------ stage


def select_prompts(manifest: pd.DataFrame, per_category: int | None, max_prompts: int | None) -> pd.DataFrame:
    """The SC stimuli of the prompts `selected_prompt_ids` chooses, sorted by stimulus id."""
    chosen = selected_prompt_ids(manifest, per_category, max_prompts)
    return manifest[manifest["prompt_id"].isin(chosen)].sort_values("stimulus_id").reset_index(drop=True)


def _stable_seed(base: int, key: str) -> int:
    import hashlib

    return (int(base) + int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)) % (2**32)


def _read_source(path: str) -> tuple[np.ndarray, int] | Exception:
    """The source recording, or the error reading it raised (raised again by each job)."""
    from voicebias.audio import read_audio

    try:
        return read_audio(path)
    except Exception as exc:
        return exc


def _convert_job(job: dict[str, Any], source: tuple[np.ndarray, int] | Exception | None = None) -> dict[str, Any]:
    """One conversion; `source` is the job's recording when already read (`_read_source`)."""
    from voicebias.audio import sha256_file, write_audio

    try:
        source = _read_source(job["src"]) if source is None else source
        if isinstance(source, Exception):
            raise source
        x, sr = source
        cond = conditioning(job["preset"], n_frames(len(x) / sr), job["condition"])
        y, notes = convert_parametric(x, sr, cond, job["floor"], job["ceiling"], job["settings"], job["seed"])
        out = Path(job["out"])
        out.parent.mkdir(parents=True, exist_ok=True)
        write_audio(out, y, sr)
        return {
            "key": job["key"],
            "status": "ok",
            "error": "",
            "sha256": sha256_file(out),
            "duration_s": round(len(y) / sr, 4),
            "sample_rate": sr,
            **notes,
        }
    except Exception as exc:  # one bad file is recorded, never fatal for the batch
        return {
            "key": job["key"],
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}",
            "sha256": "",
            "duration_s": np.nan,
            "sample_rate": np.nan,
            "peak_limited": False,
        }


def _convert_source(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs of one source recording, in order: the recording is read once, and its
    creaky and end-creak versions share one pitch analysis (`_manipulation`)."""
    source = _read_source(jobs[0]["src"])
    return [_convert_job(j, source) for j in jobs]


def convert_all(jobs: list[dict[str, Any]], workers: int | None = None) -> list[dict[str, Any]]:
    """Run conversion jobs on all cores with a progress bar (one task per source recording,
    results in the jobs' order); failures are returned, not raised."""
    from voicebias.parallel import map_processes

    groups = [list(g) for _, g in itertools.groupby(jobs, key=lambda j: j["src"])]
    if (workers or os.cpu_count() or 1) == 1 or len(jobs) < 4:
        workers = 1
    done = map_processes(_convert_source, groups, workers=workers, desc="phonation")
    return [res for group in done for res in group]


def _convert_vqvc(ph: dict[str, Any], jobs: list[dict[str, Any]], workdir: Path, root: Path) -> list[dict[str, Any]]:
    """The stage's jobs through VoiceQualityVC in its own environment (voicebias.stimuli.phonation.vqvc)."""
    import shutil

    from voicebias.audio import sha256_file
    from voicebias.stimuli.phonation import vqvc

    cfg = vqvc.VQVCConfig.from_params(ph, root)
    vqvc.check_setup(cfg)
    for j in jobs:
        Path(j["out"]).parent.mkdir(parents=True, exist_ok=True)
    results = vqvc.convert_batch(
        cfg,
        [
            {"id": j["key"], "input": j["src"], "output": j["out"], "condition": j["condition"], "seed": j["seed"]}
            for j in jobs
        ],
        workdir,
    )
    shutil.rmtree(workdir, ignore_errors=True)
    out = []
    for j, res in zip(jobs, results):
        ok = res.get("status") == "ok" and Path(j["out"]).exists()
        out.append(
            {
                "key": j["key"],
                "status": "ok" if ok else "failed",
                "error": "" if ok else str(res.get("error", "")),
                "sha256": sha256_file(j["out"]) if ok else "",
                "duration_s": res.get("duration_s", np.nan),
                "sample_rate": 16000 if ok else np.nan,
                "peak_limited": False,
            }
        )
    return out


def _convert_parametric(
    ph: dict[str, Any], jobs: list[dict[str, Any]], workdir: Path, root: Path
) -> list[dict[str, Any]]:
    """The stage's jobs through the embedded parametric converter (in this process's workers)."""
    return convert_all(jobs)


#: phonation.backend -> converter of the stage's jobs, called as (phonation params, jobs, work folder, root).
#: Metadata for the preflight: `offline`, the converter needs nothing outside this package.
CONVERTERS = Registry(
    "phonation backend",
    {
        "parametric": ("voicebias.stimuli.phonation:_convert_parametric", {"offline": True}),
        "vqvc": "voicebias.stimuli.phonation:_convert_vqvc",
    },
)
