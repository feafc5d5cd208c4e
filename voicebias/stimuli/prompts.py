"""Speech-continuation prompts (SC paper, sec. 2.1) and the voices that read them.

Two prompt sets: the NOP_set (150 neutral, open-ended English sentence starters written for this
project, data/nop_set/nop_set.yaml) and the SS_set (the gender subset of Spoken StereoSet, Lin et
al., SLT 2024, read from a local copy; paper profile). Every prompt is voiced by the study's voices
(2 male, 2 female), resampled, loudness-normalised, written as FLAC and listed in a validated
manifest.

    python -m voicebias.stimuli.prompts lint     # neutrality rules on the NOP_set

The SS_set layout and the voicing options: docs/stimuli.md, "Speech-continuation prompts".
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
import soundfile as sf
from tqdm import tqdm

from voicebias.contract import GENDERS, PROMPT_SETS, SC_PROMPT_COLUMNS, SC_STIMULUS_COLUMNS
from voicebias.errors import ConfigError, NotFound
from voicebias.io import read_yaml
from voicebias.validation import ValidationReport, expectations, require_valid

SS_COLUMNS = ["id", "speaker", "gender", "context", "irrelevant", "stereotypical", "anti-stereotypical"]
SS_SOURCE = "Spoken StereoSet (Lin, Chen & Lee, SLT 2024), gender subset"


# ------------------------------------------------------------------ NOP_set


def load_nop_set(path: Path | str) -> pd.DataFrame:
    """The NOP_set YAML as one row per starter (prompt_id, category, text, ...)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"NOP_set not found: {path}")
    doc = read_yaml(path) or {}
    cats = doc.get("categories")
    if not isinstance(cats, list):
        raise ConfigError(f"{path}: expected a 'categories' list, each with an id and its starters")
    rows = []
    for c in cats:
        for s in c.get("starters") or []:
            rows.append(
                {
                    "prompt_id": s.get("prompt_id"),
                    "prompt_set": "nop",
                    "category": c.get("id"),
                    "lang": doc.get("language", "en"),
                    "text": str(s.get("text", "")).strip(),
                    "review_status": s.get("review_status"),
                    "source": doc.get("source"),
                }
            )
    return pd.DataFrame(rows, columns=SC_PROMPT_COLUMNS)


def _lint_columns(df: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    from voicebias.stimuli.lint import RULES

    out = df.copy()
    cols = []
    for r in RULES:
        if r.lang != "en":
            continue
        out[r.name] = pd.Series(
            [f"{pid}: {', '.join(h)}" if (h := r.find(t)) else None for pid, t in zip(out["prompt_id"], out["text"])],
            index=out.index,
            dtype=object,
        )
        cols.append(r.name)
    return out, cols


def validate_nop_set(df: pd.DataFrame, n_categories: int = 15, per_category: int = 10) -> ValidationReport:
    """The 'nop_set' suite: ids and texts unique, n_categories x per_category starters,
    English neutrality rules (one column per rule), and open-ended (no final . ! ?)."""
    table, rule_cols = _lint_columns(df)
    table["category_size"] = table.groupby("category")["prompt_id"].transform("size")
    E = expectations()
    exps = [
        E.ExpectColumnValuesToBeUnique(column="prompt_id"),
        E.ExpectColumnValuesToBeUnique(column="text"),
        E.ExpectColumnValuesToNotBeNull(column="category"),
        E.ExpectColumnValuesToMatchRegex(column="prompt_id", regex=r"^nop-\d{3}$"),
        E.ExpectColumnUniqueValueCountToBeBetween(column="category", min_value=n_categories, max_value=n_categories),
        E.ExpectColumnValuesToBeInSet(column="category_size", value_set=[per_category]),
        E.ExpectColumnValuesToNotMatchRegex(column="text", regex=r"[.!?]\s*$"),
        E.ExpectColumnValueLengthsToBeBetween(column="text", min_value=20, max_value=160),
    ]
    exps += [E.ExpectColumnValuesToBeNull(column=c) for c in rule_cols]
    return require_valid(table, "nop_set", exps)


# ------------------------------------------------------------------ SS_set


def ss_audio_path(root: Path, subset: str, clip_id: Any, speaker: str) -> Path:
    return Path(root) / "speech" / subset / f"{int(clip_id):05d}_{speaker}.wav"


def load_ss_set(
    root: Path | str, subset: str = "gender", min_duration_s: float = 3.0, version: str = "v1.0"
) -> pd.DataFrame:
    """Spoken StereoSet clips of one subset longer than min_duration_s (s).

    Returns one row per clip: clip_id, speaker (TTS voice), voice_gender, text (the
    spoken context), the three candidate continuations, audio_path, duration_s.
    """
    root = Path(root)
    meta = root / "metadata" / f"{subset}_{version}.csv"
    if not root.exists():
        raise FileNotFoundError(
            f"Spoken StereoSet not found at {root}: put a copy of the released dataset there "
            f"(metadata/{subset}_{version}.csv and speech/{subset}/*.wav), `dvc add` it, or set sc_stimuli.ss_set.root"
        )
    if not meta.exists():
        raise FileNotFoundError(f"Spoken StereoSet metadata not found: {meta}")
    df = pd.read_csv(meta, dtype={"id": str}, keep_default_na=False)
    missing_cols = [c for c in SS_COLUMNS if c not in df.columns]
    if missing_cols:
        raise ConfigError(f"{meta}: missing columns {missing_cols} (expected the released layout)")
    bad_gender = sorted(set(df["gender"]) - set(GENDERS))
    if bad_gender:
        raise ConfigError(f"{meta}: gender column holds {bad_gender}; expected male/female")
    paths = [ss_audio_path(root, subset, i, s) for i, s in zip(df["id"], df["speaker"])]
    absent = [str(p.relative_to(root)) for p in paths if not p.exists()]
    if absent:
        raise FileNotFoundError(f"Spoken StereoSet audio missing for {len(absent)} clip(s), e.g. {absent[:5]}")
    durations = [sf.info(str(p)).duration for p in paths]
    out = pd.DataFrame(
        {
            "clip_id": [f"{int(i):05d}" for i in df["id"]],
            "speaker": df["speaker"],
            "voice_gender": df["gender"],
            "text": df["context"].str.strip(),
            "stereotypical": df["stereotypical"],
            "anti_stereotypical": df["anti-stereotypical"],
            "irrelevant": df["irrelevant"],
            "audio_path": [str(p) for p in paths],
            "duration_s": durations,
        }
    )
    return out[out["duration_s"] > float(min_duration_s)].reset_index(drop=True)


def ss_prompts(clips: pd.DataFrame) -> pd.DataFrame:
    """Distinct spoken contexts among the selected clips, as prompts 'ss-<first clip id>'."""
    first = clips.sort_values("clip_id").drop_duplicates("text")
    return pd.DataFrame(
        {
            "prompt_id": [f"ss-{c}" for c in first["clip_id"]],
            "prompt_set": "ss",
            "category": "spoken_stereoset",
            "lang": "en",
            "text": first["text"].to_numpy(),
            "review_status": "published dataset",
            "source": SS_SOURCE,
        },
        columns=SC_PROMPT_COLUMNS,
    ).reset_index(drop=True)


# ------------------------------------------------------------------ voices and synthesis


def sc_voices(sc_params: dict[str, Any]) -> list[tuple[str, str, str]]:
    """[(voice_gender, slot, voice_id)] e.g. ('male', 'male1', 'en-us+m3'); both genders required,
    the same number of each, no voice twice."""
    voices = sc_params.get("voices") or {}
    out = []
    for g in GENDERS:
        ids = voices.get(g) or []
        if isinstance(ids, str):
            ids = [ids]
        if not ids:
            raise NotFound(f"sc_stimuli.voices has no {g} voice (the SC study needs 2 male and 2 female)")
        out += [(g, f"{g}{k}", v) for k, v in enumerate(ids, start=1)]
    counts = {g: sum(1 for x in out if x[0] == g) for g in GENDERS}
    if len(set(counts.values())) != 1:
        raise ConfigError(f"sc_stimuli.voices is unbalanced: {counts}; give as many male as female voices")
    ids = [v for _, _, v in out]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"sc_stimuli.voices lists a voice twice: {ids}")
    return out


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-")


def synthesize_prompts(prompts: pd.DataFrame, sc_params: dict[str, Any], out_dir: Path, root: Path) -> pd.DataFrame:
    """Voice every prompt with every SC voice; returns the manifest (paths relative to root)."""
    from voicebias.stimuli.passages import check_voice_gender, make_backend, render_utterances

    backend = make_backend(sc_params, root)
    voices = sc_voices(sc_params)
    for gender, slot, voice in voices:
        check_voice_gender(backend, voice, gender, f"sc_stimuli.voices.{gender}")
    sr, target = int(sc_params["sample_rate"]), float(sc_params["target_rms_dbfs"])
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    jobs = [(p, v) for p in prompts.itertuples(index=False) for v in voices]
    paths = [out_dir / f"{p.prompt_id}-{slot}.flac" for p, (_, slot, _) in jobs]
    rendered = render_utterances(
        backend,
        [(p.text, voice, path) for (p, (_, _, voice)), path in zip(jobs, paths)],
        sr,
        target,
        desc="voicing SC prompts",
    )
    for (p, (gender, slot, voice)), path, audio in zip(jobs, paths, rendered):
        sid = f"{p.prompt_id}-{slot}"
        rows.append(
            {
                "stimulus_id": sid,
                "prompt_id": p.prompt_id,
                "prompt_set": p.prompt_set,
                "category": p.category,
                "lang": p.lang,
                "voice_gender": gender,
                "voice_id": voice,
                "backend": backend.name,
                **audio,
                "path": str(path.relative_to(root)),
                "text": p.text,
            }
        )
    manifest = pd.DataFrame(rows, columns=SC_STIMULUS_COLUMNS)
    manifest.attrs["backend"] = backend.describe()
    return manifest


def import_ss_clips(clips: pd.DataFrame, sc_params: dict[str, Any], out_dir: Path, root: Path) -> pd.DataFrame:
    """Keep each SS_set clip's own voice: resample, normalise and write it like a synthesised prompt."""
    from voicebias.audio import normalize_rms, read_audio, sha256_file, write_audio

    sr, target = int(sc_params["sample_rate"]), float(sc_params["target_rms_dbfs"])
    out_dir.mkdir(parents=True, exist_ok=True)
    prompt_of = {t: pid for pid, t in zip(ss_prompts(clips)["prompt_id"], ss_prompts(clips)["text"])}
    rows = []
    for c in tqdm(list(clips.itertuples(index=False)), desc="importing SS_set clips"):
        x, _ = read_audio(c.audio_path, target_sr=sr)
        x, gain = normalize_rms(x, target)
        sid = f"ss-{c.clip_id}-{c.voice_gender}-{_slug(c.speaker)}"
        path = out_dir / f"{sid}.flac"
        write_audio(path, x, sr)
        rows.append(
            {
                "stimulus_id": sid,
                "prompt_id": prompt_of[c.text],
                "prompt_set": "ss",
                "category": "spoken_stereoset",
                "lang": "en",
                "voice_gender": c.voice_gender,
                "voice_id": c.speaker,
                "backend": "spoken_stereoset",
                "sample_rate": sr,
                "duration_s": round(len(x) / sr, 4),
                "gain_db": round(gain, 3),
                "sha256": sha256_file(path),
                "path": str(path.relative_to(root)),
                "text": c.text,
            }
        )
    return pd.DataFrame(rows, columns=SC_STIMULUS_COLUMNS)


def validate_sc_manifest(
    manifest: pd.DataFrame, sample_rate: int, voices_per_prompt: int | None = None
) -> ValidationReport:
    """The 'sc_stimulus_manifest' suite; with voices_per_prompt, every synthesised
    prompt must be read by exactly that many voices, half of each gender."""
    table = manifest.copy()
    table["voices_for_prompt"] = table.groupby("prompt_id")["voice_id"].transform("nunique")
    table["genders_for_prompt"] = table.groupby("prompt_id")["voice_gender"].transform("nunique")
    E = expectations()
    exps = [
        E.ExpectTableColumnsToMatchSet(
            column_set=SC_STIMULUS_COLUMNS + ["voices_for_prompt", "genders_for_prompt"], exact_match=True
        ),
        E.ExpectColumnValuesToBeUnique(column="stimulus_id"),
        E.ExpectColumnValuesToBeUnique(column="path"),
        E.ExpectColumnValuesToBeInSet(column="prompt_set", value_set=list(PROMPT_SETS)),
        E.ExpectColumnValuesToBeInSet(column="voice_gender", value_set=list(GENDERS)),
        E.ExpectColumnValuesToBeInSet(column="sample_rate", value_set=[sample_rate]),
        E.ExpectColumnValuesToBeBetween(column="duration_s", min_value=1.0, max_value=30.0),
        E.ExpectColumnValuesToMatchRegex(column="sha256", regex=r"^[0-9a-f]{64}$"),
        E.ExpectColumnValuesToNotBeNull(column="text"),
        E.ExpectCompoundColumnsToBeUnique(column_list=["prompt_id", "voice_id"]),
    ]
    if voices_per_prompt:
        exps += [
            E.ExpectColumnValuesToBeInSet(column="voices_for_prompt", value_set=[voices_per_prompt]),
            E.ExpectColumnValuesToBeInSet(column="genders_for_prompt", value_set=[2]),
        ]
    return require_valid(table, "sc_stimulus_manifest", exps)


def main(argv: list[str] | None = None) -> int:
    """`python -m voicebias.stimuli.prompts lint [--nop-set PATH]`: check the NOP_set without voicing it."""
    import argparse

    from voicebias import config
    from voicebias.validation import ValidationFailed

    ap = argparse.ArgumentParser(prog="python -m voicebias.stimuli.prompts", description="Check the SC prompt sets.")
    ap.add_argument("action", choices=["lint"])
    ap.add_argument("--nop-set", default=str(config.NOP_SET))
    args = ap.parse_args(argv)
    df = load_nop_set(args.nop_set)
    try:
        report = validate_nop_set(df)
    except ValidationFailed as exc:
        print(exc)
        return 1
    print(
        f"NOP_set: {len(df)} starters in {df['category'].nunique()} categories; "
        f"{report.n_expectations} expectations passed"
    )
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
