"""Every path, defined once and anchored on the repository root (parameters: voicebias.params.load_params)."""

from __future__ import annotations

import os
from pathlib import Path


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
CONTINUUM_DIR = DATA / "continuum"
CONTINUUM_MANIFEST = CONTINUUM_DIR / "manifest.csv"
CONTINUATIONS_DIR = DATA / "continuations"
SC_SCORED_DIR = DATA / "sc_scored"
NOP_SET = DATA / "nop_set" / "nop_set.yaml"
GENERATED_DIR = DATA / "generated"
MEASURES_DIR = DATA / "measures"
INPUT_MEASURES = MEASURES_DIR / "inputs.csv"
COMPOSITE_REFERENCE = MEASURES_DIR / "composite_reference.csv"
RESPONSES_DIR = DATA / "responses"
SCORED_DIR = DATA / "scored"
SC_STIMULI_MANIFEST = SC_STIMULI_DIR / "manifest.csv"
PHONATION_MANIFEST = PHONATION_DIR / "manifest.csv"
JUDGE_RUBRIC = DATA / "judge" / "rubric.yaml"
MODELS_DIR = ROOT / "models"
CARDS_DIR = MODELS_DIR / "cards"
REPORTS = ROOT / "reports"
PARAMS_CHECK = REPORTS / "params" / "valid.json"
BANK_REPORT = REPORTS / "bank" / "bank.md"
BANK_METRICS = REPORTS / "bank" / "metrics.json"
SC_STIMULI_METRICS = REPORTS / "sc_stimuli" / "metrics.json"
GENERATE_METRICS = REPORTS / "generate" / "metrics.json"
PHONATION_REPORTS = REPORTS / "phonation"
CONTINUUM_METRICS = REPORTS / "continuum" / "metrics.json"
CONTINUUM_RESPONSES = DATA / "continuum_responses"
CONTINUUM_RESPOND_REPORTS = REPORTS / "continuum_respond"
PSYCHOMETRIC_DIR = REPORTS / "psychometric"
PSYCHOMETRIC_METRICS = PSYCHOMETRIC_DIR / "metrics.json"
PSYCHOMETRIC_TABLE = PSYCHOMETRIC_DIR / "psychometric.csv"
USAGE_DIR = REPORTS / "usage"  # what the calls used and cost: calls.csv, usage.csv, metrics.json
USAGE_TABLE = USAGE_DIR / "usage.csv"
#: the whole-run replicates' replies (data/replicates/<system>) and their spread per cell
#: (reports/replicates/<system>: cells.csv, spread.csv, metrics.json)
REPLICATES_DATA = DATA / "replicates"
REPLICATES_DIR = REPORTS / "replicates"
PHONATION_METRICS = PHONATION_REPORTS / "metrics.json"
PHONATION_MEASURES = PHONATION_REPORTS / "measures.csv"
CHECK_METRICS = PHONATION_REPORTS / "check_metrics.json"
PHONATION_EXCLUDED = PHONATION_REPORTS / "excluded_stimuli.csv"
CARRIER_GATE_DIR = REPORTS / "carrier_gate"
GATE_METRICS = CARRIER_GATE_DIR / "metrics.json"
RESPOND_REPORTS = REPORTS / "respond"
SC_CONTINUE_REPORTS = REPORTS / "sc_continue"
#: one file per system: its calls that failed in its last run (an output of the pending_calls stage)
PENDING_CALLS = REPORTS / "pending_calls"
ANALYSIS_DIR = REPORTS / "analysis"
SC_REPORTS = REPORTS / "sc"
DISAGGREGATED_DIR = REPORTS / "disaggregated"
DISAGGREGATED = DISAGGREGATED_DIR / "disaggregated.csv"
SC_METRICS = REPORTS / "sc_metrics.json"
REPORT_DIR = REPORTS / "report"
PROFILES_DIR = ROOT / "profiles"
CACHE_DIR = Path(os.environ.get("VOICEBIAS_CACHE", ROOT / ".cache"))
RESPONSE_CACHE = CACHE_DIR / "responses"
#: rendered utterances of the reference systems, shared across tasks and systems (voicebias.tts.render_cache)
RENDER_CACHE = CACHE_DIR / "renders"
MEASURE_CACHE = CACHE_DIR / "measures"
EMBEDDING_CACHE = CACHE_DIR / "embeddings"
JUDGE_CACHE = CACHE_DIR / "judge"
#: the MLflow store (sqlite database, artifacts, state marker); an output of the tracking stage
MLFLOW_DIR = ROOT / "mlruns"
TRACKING_MARKER = MLFLOW_DIR / "pipeline_state.json"
#: wall-clock facts of each stage run (untracked; see voicebias.runlog)
RUN_LOG = ROOT / "logs" / "runs.jsonl"
PARAMS = ROOT / "params.yaml"


def card_path(system: str) -> Path:
    """A system's card."""
    return CARDS_DIR / f"{system}.yaml"


def system_responses(system: str) -> Path:
    """Every task's responses of one system."""
    return RESPONSES_DIR / system


def responses_dir(system: str, task: str) -> Path:
    """Folder holding one system x task's output audio and responses table."""
    return system_responses(system) / task


def respond_reports(system: str) -> Path:
    """Folder of one system's request counts, one JSON per task, and a reference system's planted
    truth (an output of respond@SYSTEM)."""
    return RESPOND_REPORTS / system


def respond_report(system: str, task: str) -> Path:
    """Requests, shared and failed counts of one system x task."""
    return respond_reports(system) / f"{task}.json"


def respond_planted_truth(system: str) -> Path:
    """A reference system's planted truth, recorded by respond@SYSTEM beside its counts."""
    return respond_reports(system) / "planted_truth.json"


def replicates_data(system: str) -> Path:
    """One system's replies in the whole-run replicates (an output of replicates@SYSTEM)."""
    return REPLICATES_DATA / system


def replicates_reports(system: str) -> Path:
    """One system's replicate cells, spread and metrics (an output of replicates@SYSTEM)."""
    return REPLICATES_DIR / system


def continuum_responses_dir(system: str, task: str) -> Path:
    """One system x task's answers on the voice continuum (an output of continuum_respond@SYSTEM)."""
    return CONTINUUM_RESPONSES / system / task


def continuum_respond_report(system: str, task: str) -> Path:
    """Requests, shared and failed counts of one system x task on the continuum."""
    return CONTINUUM_RESPOND_REPORTS / system / f"{task}.json"


def scored_table(system: str) -> Path:
    """One system's text scores (describe words, pronouns, compliance)."""
    return SCORED_DIR / f"{system}.csv"


def acoustic_table(system: str) -> Path:
    """One system's output measures and their deltas and text-controlled nets."""
    return SCORED_DIR / f"{system}_acoustics.csv"


def continuations_dir(system: str) -> Path:
    """One continuation system's output audio and responses table."""
    return CONTINUATIONS_DIR / system


def continuation_responses(system: str) -> Path:
    return continuations_dir(system) / "responses.csv"


def continuation_report(system: str) -> Path:
    return SC_CONTINUE_REPORTS / f"{system}.json"


def sc_scored_table(system: str) -> Path:
    """One continuation system's voice quality, similarity and judge scores."""
    return SC_SCORED_DIR / f"{system}.csv"
