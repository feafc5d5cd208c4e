"""Voiced passages: every passage read by one male and one female voice per language.

Audio is synthesised, resampled to one declared rate, loudness-normalised and
written as FLAC; the manifest records each file's provenance and sha256.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from voicebias.audio import normalize_rms, resample, sha256_file, write_audio
from voicebias.tts import get_backend
from voicebias.validation import ValidationReport, expectations, require_valid

VOICE_GENDERS = ("male", "female")
MANIFEST_COLUMNS = [
    "stimulus_id", "passage_id", "lang", "pole", "voice_gender", "voice_id", "backend",
    "sample_rate", "duration_s", "gain_db", "sha256", "path",
]


def stimulus_id(passage_id: str, voice_gender: str) -> str:
    return f"{passage_id}-{voice_gender}"


def synthesize_stimuli(passages: pd.DataFrame, tts_params: dict[str, Any], out_dir: Path, root: Path) -> pd.DataFrame:
    """Synthesise every passage x voice gender; returns the manifest (paths relative to root)."""
    backend = get_backend(tts_params["backend"], rate_wpm=tts_params.get("rate_wpm", 160))
    sr_out = int(tts_params["sample_rate"])
    target = float(tts_params["target_rms_dbfs"])
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    jobs = [(p, g) for p in passages.itertuples(index=False) for g in VOICE_GENDERS]
    for p, gender in tqdm(jobs, desc="synthesising stimuli"):
        voices = tts_params["voices"].get(p.lang)
        if not voices or gender not in voices:
            raise KeyError(f"tts.voices has no {gender} voice for language '{p.lang}'")
        voice = voices[gender]
        x, sr = backend.synthesize(p.text, voice)
        x = resample(x, sr, sr_out)
        x, gain = normalize_rms(x, target)
        sid = stimulus_id(p.passage_id, gender)
        path = out_dir / f"{sid}.flac"
        write_audio(path, x, sr_out)
        rows.append({
            "stimulus_id": sid, "passage_id": p.passage_id, "lang": p.lang, "pole": p.pole,
            "voice_gender": gender, "voice_id": voice, "backend": backend.name, "sample_rate": sr_out,
            "duration_s": round(len(x) / sr_out, 4), "gain_db": round(gain, 3),
            "sha256": sha256_file(path), "path": str(path.relative_to(root)),
        })
    return pd.DataFrame(rows, columns=MANIFEST_COLUMNS)


def validate_manifest(manifest: pd.DataFrame, sample_rate: int) -> ValidationReport:
    E = expectations()
    return require_valid(manifest, "stimulus_manifest", [
        E.ExpectTableColumnsToMatchSet(column_set=MANIFEST_COLUMNS, exact_match=True),
        E.ExpectColumnValuesToBeUnique(column="stimulus_id"),
        E.ExpectColumnValuesToBeInSet(column="voice_gender", value_set=list(VOICE_GENDERS)),
        E.ExpectColumnValuesToBeInSet(column="sample_rate", value_set=[sample_rate]),
        E.ExpectColumnValuesToBeBetween(column="duration_s", min_value=1.0, max_value=120.0),
        E.ExpectColumnValuesToMatchRegex(column="sha256", regex=r"^[0-9a-f]{64}$"),
        E.ExpectCompoundColumnsToBeUnique(column_list=["passage_id", "voice_gender"]),
    ])


def run_stage(params: dict[str, Any], passages_path: Path, out_dir: Path, root: Path) -> pd.DataFrame:
    """Stage 'stimuli': voice every passage and write the validated manifest."""
    from voicebias.io import read_table, write_table

    passages = read_table(passages_path)
    manifest = synthesize_stimuli(passages, params["tts"], out_dir / "audio", root)
    validate_manifest(manifest, int(params["tts"]["sample_rate"]))
    write_table(out_dir / "manifest.csv", manifest)
    return manifest
