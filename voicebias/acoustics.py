"""Acoustic measures of a voice (Praat through parselmouth 0.4.7 / Praat 6.1.38).

One row per file, in one tidy table. Every frame-wise measure is a median over
voiced frames (Praat's pitch track), so pauses and unvoiced consonants do not pull
it. Units:

- duration_s (s); voiced_fraction (share of pitch frames that are voiced);
- f0_median_hz (Hz) and f0_median_st (semitones re 100 Hz);
- f1_hz, f2_hz, f3_hz (Hz; Burg analysis, five formants below a ceiling set per
  voice gender);
- formant_index (octaves relative to adult-male vowel norms: Peterson & Barney,
  1952, mean F1/F2/F3 over ten American English vowels = 502/1420/2386 Hz), taken
  per voiced frame and summarised by its median;
- h1_h2_db, h1_a3_db and their Iseli-corrected versions (dB), cpps_db (dB),
  hnr_db (dB): see voicebias.voice_quality for the method.

Settings per voice gender come from the `acoustics` section of params.yaml:
`pitch_range` (floor, ceiling Hz), `max_formant` (Hz), `time_step` (s); optional
`bandwidths` for the Iseli correction ('hawks_miller', default, or 'measured'),
`cpps_time_step` (s, default 0.002 as in Praat; 0.005 reads within 0.03 dB at a
third of the cost, 0.01 within about 0.1 dB at an eighth), and audio checks: `max_duration_s`, `max_clipped_fraction`, `silence_dbfs`.

Files that cannot be measured are kept in the table with status 'excluded', a
short `reason` code and the readable `error` (voicebias.audio lists the codes);
conversions applied to accepted files (stereo to mono, resampling) are in `note`.
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

from voicebias.audio import AudioChecks, AudioError, load_for_analysis
from voicebias.voice_quality import VOICE_QUALITY_COLUMNS, CPPSSettings, cpps_db, harmonic_levels, hnr_db, voiced_intervals

# Peterson & Barney (1952), Table II, adult men, averaged over the ten vowels (Hz).
MALE_FORMANT_NORMS = (502.0, 1420.0, 2386.0)

MEASURE_COLUMNS = [
    "duration_s", "voiced_fraction", "f0_median_hz", "f0_median_st",
    "f1_hz", "f2_hz", "f3_hz", "formant_index", *VOICE_QUALITY_COLUMNS,
]
STATUS_COLUMNS = ["status", "reason", "error", "note"]


@dataclass(frozen=True)
class MeasureSettings:
    """Analysis settings for one voice gender (pitch range and formant ceiling in Hz,
    time step in s) and the checks applied to each file."""

    pitch_floor: float = 60.0
    pitch_ceiling: float = 500.0
    max_formant: float = 5500.0
    time_step: float = 0.01
    max_duration_s: float = 600.0
    max_clipped_fraction: float = 0.001
    silence_dbfs: float = -60.0
    bandwidths: str = "hawks_miller"
    cpps_time_step: float = 0.002
    # H1-H2, H1-A3, CPPS and HNR cost most of the analysis; scoring that needs only
    # F0, formants and classifier margins (RQ1 output deltas) can switch them off.
    voice_quality: bool = True

    @classmethod
    def for_gender(cls, params: dict[str, Any], gender: str) -> "MeasureSettings":
        if gender not in params["pitch_range"] or gender not in params["max_formant"]:
            raise KeyError(f"acoustics settings have no entry for voice gender '{gender}' "
                           f"(pitch_range: {sorted(params['pitch_range'])}, max_formant: {sorted(params['max_formant'])})")
        floor, ceiling = params["pitch_range"][gender]
        return cls(float(floor), float(ceiling), float(params["max_formant"][gender]), float(params["time_step"]),
                   float(params.get("max_duration_s", cls.max_duration_s)),
                   float(params.get("max_clipped_fraction", cls.max_clipped_fraction)),
                   float(params.get("silence_dbfs", cls.silence_dbfs)),
                   str(params.get("bandwidths", cls.bandwidths)),
                   float(params.get("cpps_time_step", cls.cpps_time_step)),
                   bool(params.get("voice_quality", cls.voice_quality)))

    def checks(self) -> AudioChecks:
        # The signal must carry content up to the formant ceiling: Nyquist >= max_formant.
        return AudioChecks(min_sample_rate=int(np.ceil(2 * self.max_formant)), max_duration_s=self.max_duration_s,
                           max_clipped_fraction=self.max_clipped_fraction, silence_dbfs=self.silence_dbfs)


def hz_to_semitones(f_hz: float | np.ndarray, ref_hz: float = 100.0):
    """Semitones re `ref_hz` (12 per octave)."""
    return 12.0 * np.log2(np.asarray(f_hz, dtype=float) / ref_hz)


def formant_index(f1, f2, f3) -> np.ndarray:
    """Mean log2 ratio of F1-F3 to adult-male norms (octaves; 0 = male norm), per frame."""
    return np.mean(np.log2(np.stack([f1, f2, f3], axis=-1) / np.array(MALE_FORMANT_NORMS)), axis=-1)


def measure_signal(x: np.ndarray, sr: int, settings: MeasureSettings) -> dict[str, float]:
    """Measure one mono signal (sample rate `sr` Hz); raises AudioError when it holds no
    voiced speech. Returns the MEASURE_COLUMNS (units in the module docstring)."""
    if sr < 2 * settings.max_formant:
        raise AudioError(f"sample rate {sr} Hz is below twice the formant ceiling ({settings.max_formant:g} Hz)",
                         code="low_sample_rate")
    snd = parselmouth.Sound(x.astype(np.float64), sampling_frequency=sr)
    pitch = snd.to_pitch(settings.time_step, settings.pitch_floor, settings.pitch_ceiling)
    f0 = pitch.selected_array["frequency"]
    voiced = f0 > 0
    if voiced.sum() < 3:
        raise AudioError("no voiced frames found: silent, noise-only or non-speech audio", code="no_voicing")
    times = pitch.xs()[voiced]
    formant = snd.to_formant_burg(settings.time_step, 5, settings.max_formant, 0.025, 50.0)
    # Formant tracks at the voiced pitch frames (nearest formant frame).
    idx = np.clip(np.round((times - formant.x1) / formant.dx).astype(int), 0, formant.nx - 1)
    tracks = np.stack([call(formant, "To Matrix", i).values[0][idx] for i in (1, 2, 3)], axis=1)
    tracks[tracks <= 0] = np.nan
    if settings.bandwidths == "measured":
        ftimes = formant.x1 + idx * formant.dx
        bandwidths = np.array([[formant.get_bandwidth_at_time(i, t) for i in (1, 2, 3)] for t in ftimes], dtype=float)
        bandwidths[~(bandwidths > 0)] = np.nan
    elif settings.bandwidths == "hawks_miller":
        bandwidths = None
    else:
        raise ValueError(f"acoustics.bandwidths must be 'hawks_miller' or 'measured', not '{settings.bandwidths}'")
    frames = tracks[np.isfinite(tracks).all(axis=1)]
    if len(frames) < 3:
        raise AudioError("no voiced frames with three measurable formants", code="no_voicing")
    formants = [float(v) for v in np.median(frames, axis=0)]
    # The index is taken per frame, then summarised by its median over frames: F2's
    # frame distribution is bimodal (front vs back vowels), so an index built from
    # per-formant medians jumps with the vowel mix of the text.
    index = float(np.median(np.mean(np.log2(frames / np.array(MALE_FORMANT_NORMS)), axis=1)))
    f0_med = float(np.median(f0[voiced]))
    basic = {
        "duration_s": float(len(x) / sr),
        "voiced_fraction": float(voiced.mean()),
        "f0_median_hz": f0_med,
        "f0_median_st": float(hz_to_semitones(f0_med)),
        "f1_hz": formants[0],
        "f2_hz": formants[1],
        "f3_hz": formants[2],
        "formant_index": index,
    }
    if not settings.voice_quality:
        return {**basic, **{c: float("nan") for c in VOICE_QUALITY_COLUMNS}}
    harmonics = harmonic_levels(x, sr, times, f0[voiced], tracks, bandwidths)

    def med(col: str) -> float:
        v = harmonics[col].to_numpy(float)
        v = v[np.isfinite(v)]
        return float(np.median(v)) if v.size else float("nan")

    intervals = voiced_intervals(pitch.xs(), voiced, settings.time_step)
    return {
        **basic,
        "h1_h2_db": med("h1_h2_db"),
        "h1_h2_corrected_db": med("h1_h2_corrected_db"),
        "h1_a3_db": med("h1_a3_db"),
        "h1_a3_corrected_db": med("h1_a3_corrected_db"),
        "cpps_db": cpps_db(snd, intervals, CPPSSettings(time_step=settings.cpps_time_step)),
        "hnr_db": hnr_db(snd, times, settings.time_step, settings.pitch_floor),
    }


def measure_file(path: Path | str, settings: MeasureSettings, sample_rate: int = 16000) -> dict[str, Any]:
    """Check, read (mono, resampled to `sample_rate` Hz) and measure one file.

    Returns the measures plus a `note` listing conversions; raises AudioError."""
    loaded = load_for_analysis(path, target_sr=sample_rate, checks=settings.checks())
    return {**measure_signal(loaded.x, loaded.sr, settings), "note": "; ".join(loaded.notes)}


def _measure_job(job: tuple[str, str, MeasureSettings, int]) -> dict[str, Any]:
    key, path, settings, sr = job
    try:
        return {"id": key, "status": "ok", "reason": "", "error": "", **measure_file(path, settings, sr)}
    except AudioError as exc:
        return {"id": key, "status": "excluded", "reason": exc.code, "error": str(exc), "note": ""}


def measure_files(
    jobs: list[tuple[str, str | Path, MeasureSettings]],
    sample_rate: int = 16000,
    workers: int | None = None,
    desc: str = "measuring",
) -> pd.DataFrame:
    """Measure many files on all cores (one process per core, with a progress bar).

    jobs: (id, path, settings). Returns one row per id: id, status ('ok' or
    'excluded'), reason (code), error (readable), note, then MEASURE_COLUMNS (NaN
    for excluded files). A failing file never stops the rest of the batch.
    """
    workers = workers or os.cpu_count() or 1
    full = [(k, str(p), s, sample_rate) for k, p, s in jobs]
    if workers == 1 or len(full) < 4:
        rows = [_measure_job(j) for j in tqdm(full, desc=desc)]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            rows = list(tqdm(pool.map(_measure_job, full, chunksize=max(1, min(4, len(full) // (4 * workers)))),
                             total=len(full), desc=desc))
    df = pd.DataFrame(rows, columns=["id", *STATUS_COLUMNS, *MEASURE_COLUMNS])
    for col in ("reason", "error", "note"):
        df[col] = df[col].fillna("").astype(str)
    return df


def exclusion_counts(measures: pd.DataFrame) -> pd.DataFrame:
    """Counts of excluded files per reason code, plus conversions noted on accepted files.

    Returns columns kind ('excluded' or 'note'), reason, n."""
    rows = [{"kind": "excluded", "reason": r, "n": int(n)}
            for r, n in measures.loc[measures["status"] != "ok", "reason"].value_counts().sort_index().items()]
    notes = measures.loc[measures["status"] == "ok", "note"].fillna("")
    kinds: dict[str, int] = {}
    for note in notes:
        for part in filter(None, (p.strip() for p in str(note).split(";"))):
            key = "resampled" if part.startswith("resampled") else "downmixed" if "averaged to mono" in part else part
            kinds[key] = kinds.get(key, 0) + 1
    rows += [{"kind": "note", "reason": k, "n": n} for k, n in sorted(kinds.items())]
    return pd.DataFrame(rows, columns=["kind", "reason", "n"])


def measure_table(table: pd.DataFrame, path_col: str, id_col: str, gender_col: str, params: dict[str, Any],
                  root: Path, sample_rate: int, desc: str) -> pd.DataFrame:
    """Measure every file of a table with the analysis settings of its voice gender.

    Returns the table joined with the measures, status, reason, error and note columns.
    """
    jobs = [(r[id_col], root / r[path_col], MeasureSettings.for_gender(params, r[gender_col]))
            for _, r in table.iterrows()]
    measures = measure_files(jobs, sample_rate=sample_rate, desc=desc).rename(columns={"id": id_col})
    return table.merge(measures, on=id_col, how="left")


def classifier_names(acoustics_params: dict[str, Any]) -> list[str]:
    """The `acoustics.classifier` setting as a list (one name or several)."""
    c = acoustics_params["classifier"]
    return [c] if isinstance(c, str) else list(c)


def add_margins(df: pd.DataFrame, acoustics_params: dict[str, Any], root: Path, path_col: str = "path",
                sample_rate: int = 16000) -> pd.DataFrame:
    """Add one margin_<classifier> column (z_female - z_male) per configured classifier.

    Classifiers that listen to the audio (wav2vec2) get the measured files, read as
    16 kHz mono; weights folders come from `acoustics.classifier_weights` and an
    explicit label order, where a checkpoint's config has generic label names, from
    `acoustics.classifier_labels` ({name: {female: i, male: j}}).
    """
    from voicebias.classifiers import get_classifier
    from voicebias.audio import read_audio

    ok = (df["status"] == "ok").to_numpy()
    weights = acoustics_params.get("classifier_weights") or {}
    labels = acoustics_params.get("classifier_labels") or {}
    audio = None
    for name in classifier_names(acoustics_params):
        options: dict[str, Any] = {"weights": root / weights[name]} if name in weights else {}
        if name in weights and acoustics_params.get("classifier_batch_size"):
            options["batch_size"] = int(acoustics_params["classifier_batch_size"])
        if name in labels:
            options["labels"] = dict(labels[name])
        clf = get_classifier(name, **options)
        if clf.needs_audio and audio is None:
            audio = [read_audio(root / p, target_sr=16000)[0] for p in df.loc[ok, path_col]]
        df[f"margin_{name}"] = np.nan
        if ok.any():
            df.loc[ok, f"margin_{name}"] = clf.margins(df[ok], audio=audio, sample_rate=16000)
    return df


def run_stage(params: dict[str, Any], manifest_path: Path, out_measures: Path, out_reference: Path, root: Path) -> pd.DataFrame:
    """Stage 'acoustics': measure the input stimuli, add classifier margins and the composite."""
    from voicebias.composite import composite_measures, femininity_composite, reference_stats
    from voicebias.io import read_table, write_table

    manifest = read_table(manifest_path)
    ac = params["acoustics"]
    cols = ["stimulus_id", "passage_id", "lang", "pole", "voice_gender", "voice_id", "path"]
    if "phonation" in manifest:
        cols.insert(6, "phonation")
    df = measure_table(manifest[cols], "path", "stimulus_id", "voice_gender", ac, root,
                       int(params["tts"]["sample_rate"]), "measuring stimuli")
    names = classifier_names(ac)
    df = add_margins(df, ac, root)
    measures = composite_measures(names)
    reference = reference_stats(df, measures)
    df["composite"] = femininity_composite(df, reference, measures)
    write_table(out_measures, df)
    write_table(out_reference, reference)
    counts = exclusion_counts(df)
    if not counts.empty:
        print("acoustics: " + ", ".join(f"{r.n} {r.kind} ({r.reason})" for r in counts.itertuples()))
    return df
