"""Voiced passages: every passage read by one male and one female voice of its language.

With several voices per gender (tts.voices lists them, tts.voices_per_gender says how many
are used) the voices take turns: a language's passages, in pole order and then by id, are
read by the listed voices in rotation, so each voice reads the same number of passages
(to one) and every pole in near-equal shares, and voice is crossed with content and nested
in gender. Each passage is still read once per voice gender, so the number of stimuli, and
the cost of everything downstream, does not grow with the number of voices
(docs/stimuli.md, "Voices").

Audio is synthesised, resampled to one declared rate (tts.sample_rate, Hz),
loudness-normalised to one RMS level (tts.target_rms_dbfs, dBFS) and written as
16-bit FLAC; the manifest records each file's provenance and sha256, and a Great
Expectations suite checks it before the stage ends.

The backend comes from tts.backend with its own settings under tts.options
(e.g. Kokoro's `weights` folder, Azure's `output_format`); relative paths in the
options are resolved against the repository root.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pandas as pd
from tqdm import tqdm

from voicebias.audio import normalize_rms, resample, sha256_file, write_audio
from voicebias.contract import GENDERS, LANGUAGES, POLES, STIMULUS_COLUMNS
from voicebias.errors import ConfigError, NotFound
from voicebias.tts import TTSBackend, get_backend
from voicebias.validation import ValidationReport, expectations, require_valid

_PATH_OPTIONS = ("weights", "cache_dir")


def stimulus_id(passage_id: str, voice_gender: str) -> str:
    return f"{passage_id}-{voice_gender}"


def voices_in_use(tts_params: dict[str, Any], lang: str, gender: str) -> list[str]:
    """The voices of `lang` and `gender` that read passages: the first tts.voices_per_gender listed.

    >>> tts = {"voices": {"en": {"male": ["a", "b", "c"], "female": "d"}}, "voices_per_gender": 2}
    >>> voices_in_use(tts, "en", "male")
    ['a', 'b']
    """
    listed = (tts_params["voices"].get(lang) or {}).get(gender)
    if listed is None:
        raise NotFound(f"tts.voices has no {gender} voice for language '{lang}'")
    listed = [listed] if isinstance(listed, str) else list(listed)
    n = tts_params.get("voices_per_gender")
    if n is not None and len(listed) < int(n):
        raise ConfigError(f"tts.voices_per_gender is {n}, but tts.voices.{lang}.{gender} lists {len(listed)} voice(s)")
    return listed if n is None else listed[: int(n)]


def assign_voices(passages: pd.DataFrame, tts_params: dict[str, Any]) -> dict[tuple[str, str], str]:
    """The voice reading each (passage_id, voice gender): the language's voices in rotation.

    A language's passages are ordered by pole (masculine, neutral, feminine) and id; the k-th
    is read by voice k mod n of each gender. The rotation runs on across poles, so with 30
    passages and 3 voices each voice reads 10, and 3 or 4 of every pole.

    >>> p = pd.DataFrame({"passage_id": ["en-f-1", "en-m-1", "en-m-2"], "lang": "en",
    ...                   "pole": ["feminine", "masculine", "masculine"]})
    >>> v = assign_voices(p, {"voices": {"en": {"male": ["m1", "m2"], "female": ["f1", "f2"]}}})
    >>> v[("en-m-1", "male")], v[("en-m-2", "female")], v[("en-f-1", "male")]
    ('m1', 'f2', 'm1')
    """
    order = {pole: i for i, pole in enumerate(POLES)}
    out: dict[tuple[str, str], str] = {}
    for lang, g in passages.groupby("lang", sort=True):
        ranked = sorted(zip(g["pole"].map(order), g["passage_id"]))
        for gender in GENDERS:
            voices = voices_in_use(tts_params, lang, gender)
            for k, (_, pid) in enumerate(ranked):
                out[(pid, gender)] = voices[k % len(voices)]
    return out


def make_backend(tts_params: dict[str, Any], root: Path) -> TTSBackend:
    """The configured backend with its options (relative paths resolved against root)."""
    options = dict(tts_params.get("options") or {})
    for key in _PATH_OPTIONS:
        if key in options and not Path(options[key]).is_absolute():
            options[key] = str(Path(root) / options[key])
    return get_backend(tts_params["backend"], rate_wpm=tts_params["rate_wpm"], **options)


def check_voice_gender(backend: TTSBackend, voice: str, gender: str, where: str) -> None:
    """Stop when a voice the backend knows as one gender sits in the other gender's slot."""
    known = backend.voice_gender(voice)
    if known is not None and known != gender:
        raise ConfigError(f"{where}: '{voice}' is a {known} {backend.name} voice, configured as {gender}")


def render_utterance(
    backend: TTSBackend, text: str, voice: str, path: Path, sample_rate: int, target_rms_dbfs: float
) -> dict[str, Any]:
    """Synthesise, resample to sample_rate (Hz), normalise to target_rms_dbfs and write FLAC.

    Returns the manifest fields that describe the file (duration in s, gain in dB, sha256).
    """
    x, sr = backend.synthesize(text, voice)
    x = resample(x, sr, sample_rate)
    x, gain = normalize_rms(x, target_rms_dbfs)
    write_audio(path, x, sample_rate)
    return {
        "sample_rate": sample_rate,
        "duration_s": round(len(x) / sample_rate, 4),
        "gain_db": round(gain, 3),
        "sha256": sha256_file(path),
    }


def render_utterances(
    backend: TTSBackend,
    jobs: list[tuple[str, str, Path]],
    sample_rate: int,
    target_rms_dbfs: float,
    desc: str | None = None,
    meanwhile: Callable[[], Any] | None = None,
) -> list[dict[str, Any]]:
    """`render_utterance` for each (text, voice, path) job, in the jobs' order.

    A backend that may run in worker processes (`TTSBackend.processes`) renders on every
    core; each file depends on its own job alone, so the files and fields are the same
    as one by one. The first job that fails (in the jobs' order) raises its own error,
    as the serial loop would; with several processes the other jobs are finished first.
    `meanwhile` is run here while the workers synthesise (see `map_processes`).
    """

    def render(job: tuple[str, str, Path]) -> dict[str, Any]:
        text, voice, path = job
        return render_utterance(backend, text, voice, path, sample_rate, target_rms_dbfs)

    if not backend.processes:
        return [render(j) for j in tqdm(jobs, desc=desc, disable=desc is None)]
    from voicebias.parallel import map_processes

    return map_processes(render, jobs, size=lambda j: len(j[0]), desc=desc, failures="first", meanwhile=meanwhile)


def synthesize_stimuli(passages: pd.DataFrame, tts_params: dict[str, Any], out_dir: Path, root: Path) -> pd.DataFrame:
    """Synthesise every passage x voice gender, in the voices `assign_voices` gives; returns the
    manifest (paths relative to root)."""
    backend = make_backend(tts_params, root)
    sr_out = int(tts_params["sample_rate"])
    target = float(tts_params["target_rms_dbfs"])
    out_dir.mkdir(parents=True, exist_ok=True)
    for lang in sorted(set(passages["lang"])):
        for gender in GENDERS:
            for voice in voices_in_use(tts_params, lang, gender):
                check_voice_gender(backend, voice, gender, f"tts.voices.{lang}.{gender}")
    assigned = assign_voices(passages, tts_params)
    rows = []
    jobs = [(p, g) for p in passages.itertuples(index=False) for g in GENDERS]
    voices = [assigned[(p.passage_id, gender)] for p, gender in jobs]
    paths = [out_dir / f"{stimulus_id(p.passage_id, gender)}.flac" for p, gender in jobs]
    rendered = render_utterances(
        backend,
        [(p.text, v, path) for (p, _), v, path in zip(jobs, voices, paths)],
        sr_out,
        target,
        desc="synthesising stimuli",
        meanwhile=expectations,
    )  # the manifest's check then finds Great Expectations loaded
    for (p, gender), voice, path, audio in zip(jobs, voices, paths, rendered):
        sid = stimulus_id(p.passage_id, gender)
        rows.append(
            {
                "stimulus_id": sid,
                "passage_id": p.passage_id,
                "lang": p.lang,
                "pole": p.pole,
                "voice_gender": gender,
                "voice_id": voice,
                "backend": backend.name,
                **audio,
                "path": str(path.relative_to(root)),
            }
        )
    manifest = pd.DataFrame(rows, columns=STIMULUS_COLUMNS)
    manifest.attrs["backend"] = backend.describe()
    return manifest


def validate_manifest(manifest: pd.DataFrame, sample_rate: int) -> ValidationReport:
    """The 'stimulus_manifest' suite: schema, one declared rate, plausible durations,
    hashes, one file per passage x voice gender, known languages and poles."""
    E = expectations()
    return require_valid(
        manifest,
        "stimulus_manifest",
        [
            E.ExpectTableColumnsToMatchSet(column_set=STIMULUS_COLUMNS, exact_match=True),
            E.ExpectColumnValuesToBeUnique(column="stimulus_id"),
            E.ExpectColumnValuesToBeInSet(column="lang", value_set=list(LANGUAGES)),
            E.ExpectColumnValuesToBeInSet(column="pole", value_set=list(POLES)),
            E.ExpectColumnValuesToNotBeNull(column="voice_id"),
            E.ExpectColumnValuesToNotBeNull(column="backend"),
            E.ExpectColumnValuesToBeUnique(column="path"),
            E.ExpectColumnValuesToBeInSet(column="voice_gender", value_set=list(GENDERS)),
            E.ExpectColumnValuesToBeInSet(column="sample_rate", value_set=[sample_rate]),
            E.ExpectColumnValuesToBeBetween(column="duration_s", min_value=1.0, max_value=120.0),
            E.ExpectColumnValuesToMatchRegex(column="sha256", regex=r"^[0-9a-f]{64}$"),
            E.ExpectCompoundColumnsToBeUnique(column_list=["passage_id", "voice_gender"]),
        ],
    )
