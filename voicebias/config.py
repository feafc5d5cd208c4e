"""Paths and parameters, defined once and anchored on the repository root."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


def find_root() -> Path:
    """The project folder: $VOICEBIAS_ROOT, else the nearest folder at or above the
    working directory holding dvc.yaml and params.yaml, else this package's parent."""
    if os.environ.get("VOICEBIAS_ROOT"):
        return Path(os.environ["VOICEBIAS_ROOT"]).resolve()
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if (folder / "dvc.yaml").exists() and (folder / "params.yaml").exists():
            return folder
    return Path(__file__).resolve().parent.parent


ROOT = find_root()

DATA = ROOT / "data"
BANK_DIR = DATA / "bank"
TASKS_DIR = DATA / "tasks"
PASSAGES = DATA / "passages" / "passages.csv"
STIMULI_DIR = DATA / "stimuli"
STIMULI_AUDIO = STIMULI_DIR / "audio"
STIMULI_MANIFEST = STIMULI_DIR / "manifest.csv"
SC_STIMULI_DIR = DATA / "sc_stimuli"
PHONATION_DIR = DATA / "phonation"
CONTINUATIONS_DIR = DATA / "continuations"
SC_SCORED_DIR = DATA / "sc_scored"
NOP_SET = DATA / "nop_set" / "nop_set.yaml"
GENERATED_DIR = DATA / "generated"
MEASURES_DIR = DATA / "measures"
INPUT_MEASURES = MEASURES_DIR / "inputs.csv"
RESPONSES_DIR = DATA / "responses"
SCORED_DIR = DATA / "scored"
MODELS_DIR = ROOT / "models"
CARDS_DIR = MODELS_DIR / "cards"
REPORTS = ROOT / "reports"
PROFILES_DIR = ROOT / "profiles"
CACHE_DIR = Path(os.environ.get("VOICEBIAS_CACHE", ROOT / ".cache"))
#: the MLflow store (sqlite database, artifacts, state marker); an output of the tracking stage
MLFLOW_DIR = ROOT / "mlruns"
TRACKING_MARKER = MLFLOW_DIR / "pipeline_state.json"
#: wall-clock facts of each stage run (untracked; see voicebias.runlog)
RUN_LOG = ROOT / "logs" / "runs.jsonl"
PARAMS = ROOT / "params.yaml"


def responses_dir(system: str, task: str) -> Path:
    """Folder holding one system x task's output audio and responses table."""
    return RESPONSES_DIR / system / task


def scored_table(system: str) -> Path:
    return SCORED_DIR / f"{system}.csv"


def load_params(path: Path | str | None = None) -> dict[str, Any]:
    """Read params.yaml (or another profile file), validated against the schema.

    Returns a plain dict with every default filled in (voicebias.params); an unknown
    key, a wrong type or a missing setting raises ParamsError naming the key path.
    """
    from voicebias.params import validate_params

    p = Path(path) if path else PARAMS
    if not p.exists():
        raise FileNotFoundError(f"parameter file not found: {p}")
    with open(p, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    return validate_params(raw, source=p.name)
