"""Acoustic measures of a voice (Praat through parselmouth 0.4.7 / Praat 6.1.38).

One row per file, in one tidy table (`measure_files`, `measure_table`): F0, formants and the
formant index, harmonic levels, CPPS and HNR, each frame-wise measure a median over voiced frames.
The measure set is `MEASURE_SET`, one `Component` per module (pitch, formants, harmonics, cpps,
hnr). Settings per voice gender, or gender-neutral ones (`MeasureSettings.neutral`), come from the
`acoustics` section of params.yaml. Files that cannot be measured stay in the table with status
'excluded' and a reason code; `too_short` and `measure_error` come from the measuring itself.

The unit of every measure, the settings, and the `too_short` rule (MIN_VOICED_FRAMES,
`min_duration_s`): docs/instrument.md, "The acoustic measures".
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd
import parselmouth

from voicebias.audio import (
    MIN_VOICED_FRAMES,
    PITCH_WINDOW_PERIODS,
    AudioChecks,
    AudioError,
    load_for_analysis,
    min_analysable_s,
)
from voicebias.contract import MEASURE_COLUMNS
from voicebias.errors import ConfigError, NotFound
from voicebias.instruments import cpps, formants, harmonicity, harmonics, pitch
from voicebias.instruments.formants import formant_tracks
from voicebias.instruments.pitch import pitch_track

STATUS_COLUMNS = ["status", "reason", "error", "note"]


def _validated(params: dict[str, Any]) -> dict[str, Any]:
    """The `acoustics` section checked against the schema, defaults filled in."""
    from voicebias.params import Acoustics, validate_section

    return validate_section(Acoustics, params, "acoustics")


def _schema_default(field: str) -> Any:
    """The default params.yaml's schema gives `acoustics.<field>` (stated there once)."""
    from voicebias.params import Acoustics

    return Acoustics.model_fields[field].default


@dataclass(frozen=True)
class MeasureSettings:
    """Analysis settings for one voice gender (pitch range and formant ceiling in Hz,
    time step in s) and the checks applied to each file. The defaults are the schema's
    (voicebias.params.Acoustics); the pitch range and ceiling default to its gender-neutral ones."""

    pitch_floor: float = _schema_default("neutral_pitch_range")[0]
    pitch_ceiling: float = _schema_default("neutral_pitch_range")[1]
    max_formant: float = _schema_default("neutral_max_formant")
    time_step: float = _schema_default("time_step")
    max_duration_s: float = _schema_default("max_duration_s")
    max_clipped_fraction: float = _schema_default("max_clipped_fraction")
    silence_dbfs: float = _schema_default("silence_dbfs")
    bandwidths: str = _schema_default("bandwidths")
    cpps_time_step: float = _schema_default("cpps_time_step")
    # H1-H2, H1-A3, CPPS and HNR cost most of the analysis; scoring that needs only
    # F0, formants and classifier margins (RQ1 output deltas) can switch them off.
    voice_quality: bool = True
    # 'dap' (discrete all-pole on the harmonics) or 'burg' (Praat's Burg, five formants).
    formant_method: str = _schema_default("formant_method")
    # > 0: fold pitch frames an octave off the track's median back (tolerance, semitones).
    octave_check_st: float = 0.0
    # the stretch measured: whole, voiced, nucleus, steady or span:<start>:<end> (voicebias.instruments.regions)
    region: str = "whole"

    @classmethod
    def for_gender(cls, params: dict[str, Any], gender: str) -> "MeasureSettings":
        """The settings of `gender` from the `acoustics` section (validated here, so its defaults are
        the schema's)."""
        a = _validated(params)
        if gender not in a["pitch_range"] or gender not in a["max_formant"]:
            raise NotFound(
                f"acoustics settings have no entry for voice gender '{gender}' "
                f"(pitch_range: {sorted(a['pitch_range'])}, max_formant: {sorted(a['max_formant'])})"
            )
        floor, ceiling = a["pitch_range"][gender]
        return cls._from(a, float(floor), float(ceiling), float(a["max_formant"][gender]))

    @classmethod
    def neutral(cls, params: dict[str, Any]) -> "MeasureSettings":
        """Settings that do not depend on a voice gender, for voices that may follow
        their input: `neutral_pitch_range` (Hz) with the octave check `octave_check_st`
        (semitones) and `neutral_max_formant` (Hz), defaults from the schema."""
        a = _validated(params)
        floor, ceiling = a["neutral_pitch_range"]
        return replace(
            cls._from(a, float(floor), float(ceiling), float(a["neutral_max_formant"])),
            octave_check_st=float(a["octave_check_st"]),
        )

    @classmethod
    def _from(cls, a: dict[str, Any], floor: float, ceiling: float, max_formant: float) -> "MeasureSettings":
        return cls(
            pitch_floor=floor,
            pitch_ceiling=ceiling,
            max_formant=max_formant,
            time_step=float(a["time_step"]),
            max_duration_s=float(a["max_duration_s"]),
            max_clipped_fraction=float(a["max_clipped_fraction"]),
            silence_dbfs=float(a["silence_dbfs"]),
            bandwidths=str(a["bandwidths"]),
            cpps_time_step=float(a["cpps_time_step"]),
            formant_method=str(a["formant_method"]),
        )

    def checks(self) -> AudioChecks:
        # The signal must carry content up to the formant ceiling: Nyquist >= max_formant.
        return AudioChecks(
            min_sample_rate=int(np.ceil(2 * self.max_formant)),
            max_duration_s=self.max_duration_s,
            max_clipped_fraction=self.max_clipped_fraction,
            silence_dbfs=self.silence_dbfs,
        )


@dataclass(frozen=True)
class Component:
    """One part of the measure set, and one unit of the measurement cache
    (voicebias.instruments.measure_cache): its own settings, its own code.

    `module` computes it: its MEASURES (the MEASURE_COLUMNS it gives; duration_s comes with
    every read) and ``measure(analysis) -> {measure: value}`` on the shared analysis of a
    signal (`_Analysis`). `settings` are the MeasureSettings fields it reads itself, `inputs`
    the components it builds on (their settings and code decide it too). Its code, for the
    cache key, is the whole source of `module` and of every instrument module it imports
    (`code_files`), so a helper a measure starts to use changes the key without a list to edit.
    """

    name: str
    module: ModuleType
    settings: tuple[str, ...]
    inputs: tuple[str, ...] = ()

    @property
    def measures(self) -> tuple[str, ...]:
        return tuple(self.module.MEASURES)

    def measure(self, analysis: "_Analysis") -> dict[str, float]:
        return self.module.measure(analysis)


#: the measure set, in the order a file is measured: every other component is taken at the
#: pitch frames, and the harmonic levels at the formants too
MEASURE_SET = (
    Component("pitch", pitch, ("pitch_floor", "pitch_ceiling", "time_step", "octave_check_st", "region")),
    Component("formants", formants, ("max_formant", "formant_method"), ("pitch",)),
    Component("harmonics", harmonics, ("bandwidths",), ("pitch", "formants")),
    Component("cpps", cpps, ("cpps_time_step",), ("pitch",)),
    Component("hnr", harmonicity, (), ("pitch",)),
)
#: name -> component, in measuring order
COMPONENTS = {c.name: c for c in MEASURE_SET}
#: what reads a file for the instrument (voicebias.audio.read_part); its code keys the read entries
READER = "voicebias.audio"


def code_files(module: str, root: Path | None = None) -> list[Path]:
    """The source files whose text decides what `module` computes: the module and every module of
    voicebias.instruments or voicebias.audio it imports, at any depth (voicebias.codedeps.closure,
    restricted to the numerical code; the package's error classes and paths are not in it).
    `root`: the folder holding the voicebias package (default: this one's)."""
    import voicebias
    from voicebias.codedeps import closure

    root = Path(root) if root is not None else Path(voicebias.__file__).resolve().parent.parent
    keep = (root / "voicebias" / "instruments", root / "voicebias" / "audio.py")
    return sorted(f for f in closure(module, root) if any(f == k or k in f.parents for k in keep))


def component_sources() -> dict[str, list[Path]]:
    """The source files of the reader and of each component (`code_files`), hashed into the
    measurement cache's keys (voicebias.instruments.measure_cache)."""
    return {"read": code_files(READER), **{c.name: code_files(c.module.__name__) for c in MEASURE_SET}}


def components_for(settings: MeasureSettings, wanted: tuple[str, ...] | list[str] | None = None) -> tuple[str, ...]:
    """The components a file is measured with: `wanted` (default all of them) in
    MEASURE_SET order, pitch and formants alone when `voice_quality` is off. Pitch and
    formants are always measured: every other component is taken at their frames, and
    a file without them is excluded."""
    names = tuple(COMPONENTS)
    chosen = names if wanted is None else tuple(c for c in names if c in wanted)
    unknown = sorted(set(wanted or ()) - set(names))
    if unknown:
        raise ConfigError(f"unknown measure components {unknown}; the instrument has {', '.join(names)}")
    if chosen[:2] != names[:2]:
        raise ConfigError(f"measure components must include pitch and formants, got {list(chosen)}")
    return chosen if settings.voice_quality else names[:2]


class _Analysis:
    """One signal's shared intermediate results (pitch track, formant tracks), computed
    once, on first use, whichever components ask for them."""

    def __init__(self, x: np.ndarray, sr: int, settings: MeasureSettings):
        self.x, self.sr, self.s = np.asarray(x, dtype=np.float64), sr, settings
        self._snd = self._pitch = self._formants = None

    @property
    def snd(self) -> parselmouth.Sound:
        if self._snd is None:
            self._snd = parselmouth.Sound(self.x, sampling_frequency=self.sr)
        return self._snd

    def pitch(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(all frame times, voiced mask, voiced times, voiced f0 in Hz): voicebias.instruments.pitch."""
        if self._pitch is None:
            self._pitch = pitch_track(self.snd, self.s)
        return self._pitch

    def formants(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(F1-F3 tracks at the voiced frames, measured bandwidths or None), Hz: voicebias.instruments.formants."""
        if self._formants is None:
            self._formants = formant_tracks(self)
        return self._formants[:2]

    def f4(self) -> np.ndarray:
        """The F4 track at the voiced frames (Hz, NaN where none was found): voicebias.instruments.formants."""
        self.formants()
        return self._formants[2]


def pitch_frames(n_samples: int, sr: int, settings: MeasureSettings) -> int:
    """The number of frames Praat's pitch analysis gives a signal of `n_samples` samples at
    `sr` Hz (0: shorter than the window), by Praat's own arithmetic (Sampled_shortTermAnalysis):
    floor((duration - window) / time_step) + 1, window = PITCH_WINDOW_PERIODS / pitch_floor (s)."""
    duration, window = (1.0 / sr) * n_samples, PITCH_WINDOW_PERIODS / settings.pitch_floor
    return 0 if window > duration else math.floor((duration - window) / settings.time_step) + 1


def min_duration_s(settings: MeasureSettings) -> float:
    """The shortest signal (s) the measure set can measure with these settings: the pitch
    window plus MIN_VOICED_FRAMES - 1 time steps (module docstring, `too_short`)."""
    return min_analysable_s(settings.pitch_floor, settings.time_step)


def check_settings(settings: MeasureSettings) -> None:
    """ConfigError for a formant method, bandwidth source or region the instrument does not know."""
    from voicebias.instruments.regions import parse

    try:
        parse(settings.region)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if settings.bandwidths not in ("hawks_miller", "measured"):
        raise ConfigError(f"acoustics.bandwidths must be 'hawks_miller' or 'measured', not '{settings.bandwidths}'")
    if settings.formant_method not in ("dap", "burg"):
        raise ConfigError(f"acoustics.formant_method must be 'dap' or 'burg', not '{settings.formant_method}'")


def measure_components(
    x: np.ndarray, sr: int, settings: MeasureSettings, components: tuple[str, ...] | list[str]
) -> dict[str, dict[str, Any]]:
    """Measure the given components of one mono signal (sample rate `sr` Hz), in MEASURE_SET
    order, sharing the pitch and formant tracks between them.

    Returns {component: {"values": {measure: value}}} for each component measured, or
    {"excluded": [code, message]} for the first one that cannot be measured (an
    AudioError: no voicing, no formants); components after it are not measured.
    Raises AudioError for a signal that cannot be analysed at all (`low_sample_rate`,
    `too_short`: shorter than min_duration_s)."""
    check_settings(settings)
    if sr < 2 * settings.max_formant:
        raise AudioError(
            f"sample rate {sr} Hz is below twice the formant ceiling ({settings.max_formant:g} Hz)",
            code="low_sample_rate",
        )
    if pitch_frames(len(x), sr, settings) < MIN_VOICED_FRAMES:
        raise AudioError(
            f"too short to measure: {1000 * len(x) / sr:.1f} ms; the pitch analysis (a window of "
            f"{PITCH_WINDOW_PERIODS:g} periods of the {settings.pitch_floor:g} Hz floor, "
            f"{MIN_VOICED_FRAMES} frames {settings.time_step:g} s apart) needs at least "
            f"{1000 * min_duration_s(settings):.1f} ms",
            code="too_short",
        )
    a = _Analysis(x, sr, settings)
    out: dict[str, dict[str, Any]] = {}
    for c in MEASURE_SET:
        if c.name not in components:
            continue
        try:
            out[c.name] = {"values": c.measure(a)}
        except AudioError as exc:
            out[c.name] = {"excluded": [exc.code, str(exc)]}
            break
    return out


def measure_signal(x: np.ndarray, sr: int, settings: MeasureSettings) -> dict[str, float]:
    """Measure one mono signal (sample rate `sr` Hz); raises AudioError when it holds no
    voiced speech. Returns the MEASURE_COLUMNS (units in the module docstring)."""
    measured = measure_components(x, sr, settings, components_for(settings))
    row: dict[str, float] = {"duration_s": float(len(x) / sr)}
    for name, rec in measured.items():
        if "excluded" in rec:
            raise AudioError(rec["excluded"][1], code=rec["excluded"][0])
        row.update(rec["values"])
    return {c: row.get(c, float("nan")) for c in MEASURE_COLUMNS}


def measure_file(path: Path | str, settings: MeasureSettings, sample_rate: int = 16000) -> dict[str, Any]:
    """Check, read (mono, resampled to `sample_rate` Hz) and measure one file.

    Returns the measures plus a `note` listing conversions; raises AudioError."""
    loaded = load_for_analysis(path, target_sr=sample_rate, checks=settings.checks())
    return {**measure_signal(loaded.x, loaded.sr, settings), "note": "; ".join(loaded.notes)}


def measure_files(
    jobs: list[tuple],
    sample_rate: int = 16000,
    workers: int | None = None,
    desc: str = "measuring",
    cache_dir: Path | str | None = None,
    components: tuple[str, ...] | list[str] | None = None,
) -> pd.DataFrame:
    """Measure many files on all cores (one process per core, with a progress bar).

    jobs: (id, path, settings) or (id, path, settings, part), part one of
    voicebias.instruments.measure_cache.PARTS ('whole', the default; 'first_half',
    'second_half': the halves of the file as read). Returns one row per id: id, status
    ('ok' or 'excluded'), reason (code), error (readable), note, then MEASURE_COLUMNS
    (NaN for excluded files). A failing file never stops the rest of the batch: an
    error other than a refusal (AudioError) is that file's row, reason `measure_error`
    with the error's text.

    With `cache_dir`, every component of every file is looked up in the measurement
    cache there first (keyed by the audio's sha256, the part, the sample rate, the
    component's settings and code) and only missing components are measured; the
    counts go to `measure_files.last_counts` and to stderr. `components` (default all)
    names the components a stage uses (components_for); the measures of the others are
    NaN in the table, not measured. A cache entry that is damaged or of the wrong shape is
    measured again and counted (`corrupt` in the counts).
    """
    from voicebias.instruments.measure_cache import MeasureCache, measure_jobs

    cache = MeasureCache(cache_dir) if cache_dir is not None else None
    rows, counts = measure_jobs(
        jobs, sample_rate, workers or os.cpu_count() or 1, desc, cache, components, sys.modules[__name__]
    )
    measure_files.last_counts = counts
    if cache is not None:
        print(
            f"{desc}: {counts['files']} files; "
            + ", ".join(
                f"{c} {counts['measured'][c]} measured / {counts['cached'][c]} cached"
                for c in COMPONENTS
                if counts["measured"][c] or counts["cached"][c]
            )
            + (f"; {counts['corrupt']} damaged cache entries measured again" if counts["corrupt"] else ""),
            file=sys.stderr,
        )
    df = pd.DataFrame(rows, columns=["id", *STATUS_COLUMNS, *MEASURE_COLUMNS])
    for col in ("reason", "error", "note"):
        df[col] = df[col].fillna("").astype(str)
    return df


measure_files.last_counts = {}


def exclusion_counts(measures: pd.DataFrame) -> pd.DataFrame:
    """Counts of excluded files per reason code, plus conversions noted on accepted files.

    Returns columns kind ('excluded' or 'note'), reason, n."""
    rows = [
        {"kind": "excluded", "reason": r, "n": int(n)}
        for r, n in measures.loc[measures["status"] != "ok", "reason"].value_counts().sort_index().items()
    ]
    notes = measures.loc[measures["status"] == "ok", "note"].fillna("")
    kinds: dict[str, int] = {}
    for note in notes:
        for part in filter(None, (p.strip() for p in str(note).split(";"))):
            key = "resampled" if part.startswith("resampled") else "downmixed" if "averaged to mono" in part else part
            kinds[key] = kinds.get(key, 0) + 1
    rows += [{"kind": "note", "reason": k, "n": n} for k, n in sorted(kinds.items())]
    return pd.DataFrame(rows, columns=["kind", "reason", "n"])


def measure_table(
    table: pd.DataFrame,
    path_col: str,
    id_col: str,
    gender_col: str,
    params: dict[str, Any],
    root: Path,
    sample_rate: int,
    desc: str,
    cache_dir: Path | None = None,
    components: tuple[str, ...] | list[str] | None = None,
) -> pd.DataFrame:
    """Measure every file of a table with the analysis settings of its voice gender.

    Returns the table joined with the measures, status, reason, error and note columns.
    """
    jobs = [
        (r[id_col], root / r[path_col], MeasureSettings.for_gender(params, r[gender_col])) for _, r in table.iterrows()
    ]
    measures = measure_files(
        jobs, sample_rate=sample_rate, desc=desc, cache_dir=cache_dir, components=components
    ).rename(columns={"id": id_col})
    return table.merge(measures, on=id_col, how="left")


def classifier_names(acoustics_params: dict[str, Any]) -> list[str]:
    """The `acoustics.classifier` setting as a list (one name or several)."""
    c = acoustics_params["classifier"]
    return [c] if isinstance(c, str) else list(c)


def add_margins(
    df: pd.DataFrame, acoustics_params: dict[str, Any], root: Path, path_col: str = "path", sample_rate: int = 16000
) -> pd.DataFrame:
    """Add one margin_<classifier> column (z_female - z_male) per configured classifier.

    Classifiers that listen to the audio (wav2vec2) get the measured files, read as
    16 kHz mono; weights folders come from `acoustics.classifier_weights` and an
    explicit label order, where a checkpoint's config has generic label names, from
    `acoustics.classifier_labels` ({name: {female: i, male: j}}).
    """
    from voicebias.audio import read_audio
    from voicebias.instruments.classifiers import get_classifier

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
