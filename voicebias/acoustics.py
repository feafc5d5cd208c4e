"""Acoustic measures of a voice (Praat through parselmouth).

Every measure is a median over voiced frames, so pauses and unvoiced consonants do
not pull it. Units: F0 and formants in Hz, F0 also in semitones re 100 Hz, the
formant index in octaves relative to adult-male vowel norms (Peterson & Barney,
1952: mean F1/F2/F3 over ten American English vowels = 502/1420/2386 Hz), taken
per voiced frame and summarised by its median.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import parselmouth
from parselmouth.praat import call
from tqdm import tqdm

from voicebias.audio import AudioError, read_audio

# Peterson & Barney (1952), Table II, adult men, averaged over the ten vowels (Hz).
MALE_FORMANT_NORMS = (502.0, 1420.0, 2386.0)

MEASURE_COLUMNS = [
    "duration_s", "voiced_fraction", "f0_median_hz", "f0_median_st",
    "f1_hz", "f2_hz", "f3_hz", "formant_index",
]


@dataclass(frozen=True)
class MeasureSettings:
    """Analysis settings for one voice gender (pitch range and formant ceiling in Hz)."""

    pitch_floor: float = 60.0
    pitch_ceiling: float = 500.0
    max_formant: float = 5500.0
    time_step: float = 0.01

    @classmethod
    def for_gender(cls, params: dict[str, Any], gender: str) -> "MeasureSettings":
        floor, ceiling = params["pitch_range"][gender]
        return cls(float(floor), float(ceiling), float(params["max_formant"][gender]), float(params["time_step"]))


def hz_to_semitones(f_hz: float | np.ndarray, ref_hz: float = 100.0):
    """Semitones re `ref_hz` (12 per octave)."""
    return 12.0 * np.log2(np.asarray(f_hz, dtype=float) / ref_hz)


def formant_index(f1, f2, f3) -> np.ndarray:
    """Mean log2 ratio of F1-F3 to adult-male norms (octaves; 0 = male norm), per frame."""
    return np.mean(np.log2(np.stack([f1, f2, f3], axis=-1) / np.array(MALE_FORMANT_NORMS)), axis=-1)


def measure_signal(x: np.ndarray, sr: int, settings: MeasureSettings) -> dict[str, float]:
    """Measure one mono signal; raises AudioError when it holds no voiced speech."""
    snd = parselmouth.Sound(x.astype(np.float64), sampling_frequency=sr)
    pitch = snd.to_pitch(settings.time_step, settings.pitch_floor, settings.pitch_ceiling)
    f0 = pitch.selected_array["frequency"]
    voiced = f0 > 0
    if voiced.sum() < 3:
        raise AudioError("no voiced frames found: silent, noise-only or non-speech audio")
    times = pitch.xs()[voiced]
    formant = snd.to_formant_burg(settings.time_step, 5, settings.max_formant, 0.025, 50.0)
    # Formant tracks at the voiced pitch frames (nearest formant frame).
    idx = np.clip(np.round((times - formant.x1) / formant.dx).astype(int), 0, formant.nx - 1)
    tracks = np.stack([call(formant, "To Matrix", i).values[0][idx] for i in (1, 2, 3)], axis=1)
    tracks[tracks <= 0] = np.nan
    frames = tracks[np.isfinite(tracks).all(axis=1)]
    if len(frames) < 3:
        raise AudioError("no voiced frames with three measurable formants")
    formants = [float(v) for v in np.median(frames, axis=0)]
    # The index is taken per frame, then summarised by its median over frames: F2's
    # frame distribution is bimodal (front vs back vowels), so an index built from
    # per-formant medians jumps with the vowel mix of the text.
    index = float(np.median(np.mean(np.log2(frames / np.array(MALE_FORMANT_NORMS)), axis=1)))
    f0_med = float(np.median(f0[voiced]))
    return {
        "duration_s": float(len(x) / sr),
        "voiced_fraction": float(voiced.mean()),
        "f0_median_hz": f0_med,
        "f0_median_st": float(hz_to_semitones(f0_med)),
        "f1_hz": formants[0],
        "f2_hz": formants[1],
        "f3_hz": formants[2],
        "formant_index": index,
    }


def measure_file(path: Path | str, settings: MeasureSettings, sample_rate: int = 16000) -> dict[str, float]:
    x, sr = read_audio(path, target_sr=sample_rate)
    return measure_signal(x, sr, settings)


def _measure_job(job: tuple[str, str, MeasureSettings, int]) -> dict[str, Any]:
    key, path, settings, sr = job
    try:
        return {"id": key, "status": "ok", "error": "", **measure_file(path, settings, sr)}
    except AudioError as exc:
        return {"id": key, "status": "excluded", "error": str(exc)}


def measure_files(
    jobs: list[tuple[str, str, MeasureSettings]],
    sample_rate: int = 16000,
    workers: int | None = None,
    desc: str = "measuring",
) -> pd.DataFrame:
    """Measure many files on all cores; one row per id, failures kept with their reason."""
    workers = workers or os.cpu_count() or 1
    full = [(k, str(p), s, sample_rate) for k, p, s in jobs]
    if workers == 1 or len(full) < 4:
        rows = [_measure_job(j) for j in tqdm(full, desc=desc)]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            rows = list(tqdm(pool.map(_measure_job, full, chunksize=4), total=len(full), desc=desc))
    df = pd.DataFrame(rows)
    for col in MEASURE_COLUMNS:
        if col not in df:
            df[col] = np.nan
    return df[["id", "status", "error", *MEASURE_COLUMNS]]


def measure_table(table: pd.DataFrame, path_col: str, id_col: str, gender_col: str, params: dict[str, Any],
                  root: Path, sample_rate: int, desc: str) -> pd.DataFrame:
    """Measure every file of a table with the analysis settings of its voice gender.

    Returns the table joined with the measures, status and error columns.
    """
    jobs = [(r[id_col], root / r[path_col], MeasureSettings.for_gender(params, r[gender_col]))
            for _, r in table.iterrows()]
    measures = measure_files(jobs, sample_rate=sample_rate, desc=desc).rename(columns={"id": id_col})
    return table.merge(measures, on=id_col, how="left")


def run_stage(params: dict[str, Any], manifest_path: Path, out_measures: Path, out_reference: Path, root: Path) -> pd.DataFrame:
    """Stage 'acoustics': measure the input stimuli, add classifier margins and the composite."""
    from voicebias.classifiers import get_classifier
    from voicebias.composite import composite_measures, femininity_composite, reference_stats
    from voicebias.io import read_table, write_table

    manifest = read_table(manifest_path)
    ac = params["acoustics"]
    table = manifest[["stimulus_id", "passage_id", "lang", "pole", "voice_gender", "voice_id", "path"]]
    df = measure_table(table, "path", "stimulus_id", "voice_gender", ac, root, int(params["tts"]["sample_rate"]),
                       "measuring stimuli")
    names = [ac["classifier"]] if isinstance(ac["classifier"], str) else list(ac["classifier"])
    ok = df["status"] == "ok"
    for name in names:
        df[f"margin_{name}"] = np.nan
        df.loc[ok, f"margin_{name}"] = get_classifier(name).margins(df[ok])
    measures = composite_measures(names)
    reference = reference_stats(df, measures)
    df["composite"] = femininity_composite(df, reference, measures)
    write_table(out_measures, df)
    write_table(out_reference, reference)
    return df
