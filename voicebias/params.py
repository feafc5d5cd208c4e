"""The schema of params.yaml: one class per section, unknown keys refused, defaults stated once.

`validate_params(raw)` checks a parameter mapping (params.yaml or a resolved profile)
and returns it as a plain dict with every default filled in. An unknown key or a
wrong type stops with the full key path, e.g.::

    systems.mixed.content_wieght: unknown key; did you mean content_weight?
    systems.voice_faithful.error_rate: expected a number, got 'high'

Every stage and CLI command reads parameters through `load_params`,
which calls this, so a typo never silently falls back to a default.

System sections are checked against the adapter their card names
(`models/cards/<system>.yaml`), since each adapter takes its own settings.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from voicebias.config import CARDS_DIR, PARAMS
from voicebias.contract import CONDITIONS, FAULTS, GENDERS, LANGUAGES, POLES
from voicebias.errors import VoicebiasError
from voicebias.io import read_yaml
from voicebias.tasks import TASK_NAMES

Lang = Literal[LANGUAGES]
Pole = Literal[POLES]
Gender = Literal[GENDERS]
Condition = Literal[CONDITIONS]
# Names the registries of the lower layers hold (tests/unit/test_params.py ties each to its
# registry, and TaskName to data/tasks/prompts.yaml), so a misspelt name stops at validation.
TTSBackend = Literal["espeak", "kokoro", "azure"]
ClassifierName = Literal["acoustic_norms", "w2v2_commonvoice", "w2v2_librispeech"]
TaskName = Literal[TASK_NAMES]
Prob = Annotated[float, Field(ge=0.0, le=1.0)]
PositiveInt = Annotated[int, Field(ge=1)]

#: the error type of a value that must not be in params (a key, a URL with credentials): reported
#: without the value (`_messages`)
SECRET_ERROR = "secret_in_params"


def _no_credentials(url: str) -> str:
    from voicebias.secrets import url_credentials

    wrong = url_credentials(url)
    if wrong:
        raise PydanticCustomError(SECRET_ERROR, wrong)
    return url


def _variable_name(name: str) -> str:
    from voicebias.secrets import not_a_variable_name

    wrong = not_a_variable_name(name)
    if wrong:
        raise PydanticCustomError(SECRET_ERROR, wrong + "; set the key in the environment or .env and name it here")
    return name


#: an http(s) address without credentials in it
Url = Annotated[str, AfterValidator(_no_credentials)]
#: the name of an environment variable (never the key it holds)
EnvName = Annotated[str, AfterValidator(_variable_name)]


class Section(BaseModel):
    """A params.yaml mapping: unknown keys are errors, values are checked by type."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


# ---------------------------------------------------------------- shared pieces


class Requirements(Section):
    """What a backend needs on this machine (read by `voicebias preflight`)."""

    env: list[str] = []
    weights: str | None = None
    checkout: str | None = None
    gpu: bool = False


class Retry(Section):
    """Exponential backoff for transient failures (s)."""

    max_attempts: PositiveInt = 4
    base_delay_s: Annotated[float, Field(ge=0.0)] = 1.0
    max_delay_s: Annotated[float, Field(ge=0.0)] = 30.0


class Breaker(Section):
    """A circuit breaker per endpoint of a served system (voicebias.clients.endpoints.Breaker): after
    `failures` consecutive failures to reach an endpoint nothing is sent there for `cooldown_s` (s), then
    one probe; each failed probe doubles the cool-down (at most `max_cooldown_s`, s), and after
    `max_reopens` re-opens in a row the system's remaining requests are recorded as failed, unsent."""

    failures: PositiveInt = 5
    cooldown_s: Annotated[float, Field(gt=0.0)] = 10.0
    max_cooldown_s: Annotated[float, Field(gt=0.0)] = 120.0
    max_reopens: Annotated[int, Field(ge=0)] = 3

    @model_validator(mode="after")
    def _longest_at_least_first(self) -> "Breaker":
        if self.max_cooldown_s < self.cooldown_s:
            raise ValueError(
                f"max_cooldown_s ({self.max_cooldown_s:g}) must be at least cooldown_s ({self.cooldown_s:g})"
            )
        return self


class ASR(Section):
    """A local Whisper folder transcribing outputs that come without text."""

    model: str
    device: str = "cpu"
    max_new_tokens: PositiveInt = 200
    beams: PositiveInt = 1
    #: clips per generate call (default 8 on a GPU, 1 on the CPU); transcripts do not depend on it
    batch_size: PositiveInt | None = None


class LLMEndpoint(Section):
    """A writer or judge model of the bank extension (voicebias.clients.chat.BACKENDS); unset keys
    take the backend's own defaults."""

    name: str | None = None
    backend: Literal["openai", "gemini", "transformers"] = "openai"
    model: str | None = None
    base_url: Url | None = None
    api_key_env: EnvName | None = None
    path: str | None = None
    device: str | None = None
    temperature: float | None = None
    timeout_s: Annotated[float, Field(gt=0.0)] | None = None
    max_retries: Annotated[int, Field(ge=0)] | None = None
    retry_wait_s: Annotated[float, Field(ge=0.0)] | None = None
    json_mode: bool | None = None


# ---------------------------------------------------------------- sections


class Base(Section):
    profile: str
    seed: int
    languages: list[Lang]
    poles: list[Pole]


class Bank(Section):
    dir: str = "data/bank"
    length_window: dict[Lang, tuple[int, int]]


class GenderVoices(Section):
    """The voices of one language, per gender, in order of use (one name is a list of one)."""

    male: list[str]
    female: list[str]

    @field_validator("male", "female", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("male", "female")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("needs at least one voice")
        repeated = sorted({v for v in value if value.count(v) > 1})
        if repeated:
            raise ValueError(f"names a voice more than once: {', '.join(repeated)}")
        return value


class TTS(Section):
    backend: TTSBackend = "espeak"
    sample_rate: PositiveInt = 16000
    target_rms_dbfs: float = -23.0
    voices: dict[Lang, GenderVoices]
    #: how many of each list's voices read the passages (the first N; null: all of them)
    voices_per_gender: PositiveInt | None = None
    rate_wpm: PositiveInt = 160
    options: dict[str, Any] = {}
    requires: Requirements = Requirements()

    @model_validator(mode="after")
    def _enough_voices(self) -> "TTS":
        n = self.voices_per_gender
        if n is not None:
            for lang, voices in self.voices.items():
                for gender in GENDERS:
                    listed = getattr(voices, gender)
                    if len(listed) < n:
                        raise ValueError(
                            f"voices_per_gender is {n}, but tts.voices.{lang}.{gender} lists {len(listed)} voice(s)"
                        )
        return self


class SSSet(Section):
    enabled: bool = False
    root: str = "data/external/spoken_stereoset"
    subset: str = "gender"
    min_duration_s: Annotated[float, Field(ge=0.0)] = 3.0
    voicing: Literal["sc_voices", "original"] = "sc_voices"


class SCVoices(Section):
    male: list[str]
    female: list[str]


class SCStimuli(Section):
    nop_set: str = "data/nop_set/nop_set.yaml"
    nop_categories: PositiveInt = 15
    nop_per_category: PositiveInt = 10
    backend: TTSBackend = "espeak"
    rate_wpm: PositiveInt = 130
    sample_rate: PositiveInt = 16000
    target_rms_dbfs: float = -23.0
    voices: SCVoices
    ss_set: SSSet = SSSet()
    options: dict[str, Any] = {}
    requires: Requirements = Requirements()


class Preset(Section):
    """A phonation preset in SD units per 20 ms frame (VoiceQualityVC features)."""

    shape: Literal["constant", "ramp"] = "constant"
    start: Annotated[float, Field(ge=0.0, le=1.0)] = 0.5
    targets: dict[Literal["creak", "cpps", "h1_h2", "pitch", "h1_a3", "pitch_var"], float] = {}


class Parametric(Section):
    """Physical size of one SD unit in the parametric phonation converter."""

    creak_semitones_per_sd: float = 0.8
    jitter_per_sd: float = 0.01
    jitter_per_cpps_sd: float = 0.005
    max_jitter: float = 0.03
    alternation_per_sd: float = 0.1
    tilt_db_per_octave_per_sd: float = 1.0
    tilt_reference_hz: float = 50.0
    tilt_max_hz: float = 600.0
    shelf_db_per_sd: float = 1.0
    shelf_hz: float = 2000.0
    aspiration_per_sd: float = 0.05


class VQVC(Section):
    """The user's VoiceQualityVC checkout and checkpoints (run in its own environment)."""

    repo: str = "external/VQVC"
    python: str | None = None
    checkpoint: str = "models/vqvc/G_VQVC.pth"
    wavlm: str = "models/vqvc/WavLM-Large.pt"
    speaker_encoder: str = "models/vqvc/pretrained_bak_5805000.pt"
    config: str = "configs/freevc.json"
    device: str = "auto"
    baseline: dict[str, float] = {}
    seed: int = 0
    load_timeout_s: Annotated[float, Field(gt=0.0)] = 900.0
    item_timeout_s: Annotated[float, Field(gt=0.0)] = 120.0


class Phonation(Section):
    backend: Literal["parametric", "vqvc"] = "parametric"
    conditions: list[Condition] = list(CONDITIONS)
    prompts_per_category: PositiveInt | None = None
    max_prompts: PositiveInt | None = None
    presets: dict[Condition, Preset]
    parametric: Parametric = Parametric()
    vqvc: VQVC | None = None
    #: the largest share of stimuli the manipulation check may exclude (classifier flips, unmeasurable
    #: files), each counted with its reason; above it the check stops the run
    max_excluded_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.02


class Continuum(Section):
    """The voice continuum (docs/psychometric.md): `passages_per_pole` passages of each pole in
    `languages`, each passage's male and female renderings as base voices, `steps` steps between
    the endpoints (defaults: Hillenbrand et al., 1995), checked against their targets."""

    enabled: bool = True
    steps: Annotated[int, Field(ge=3, le=41)] = 7
    variant: Literal["f0_and_formants", "f0_only"] = "f0_and_formants"
    f0_male_hz: Annotated[float, Field(gt=0.0)] = 129.4
    f0_female_hz: Annotated[float, Field(gt=0.0)] = 219.1
    formant_ratio: Annotated[float, Field(ge=1.0, le=1.5)] = 1.157
    languages: list[Lang] = ["en"]
    poles: list[Pole] = ["masculine", "feminine"]
    passages_per_pole: PositiveInt = 4
    f0_tolerance_st: Annotated[float, Field(gt=0.0)] = 0.5
    formant_tolerance_oct: Annotated[float, Field(gt=0.0)] = 0.03
    corrections: Annotated[int, Field(ge=0, le=5)] = 2
    #: the tasks every system answers on the continuum's steps
    tasks: list[Literal["describe", "summarize"]] = ["describe", "summarize"]
    #: the largest share of steps the manipulation check may exclude; above it the stage stops
    max_excluded_fraction: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1

    @model_validator(mode="after")
    def _endpoints_in_order(self) -> "Continuum":
        if self.f0_female_hz <= self.f0_male_hz:
            raise ValueError(f"f0_female_hz ({self.f0_female_hz:g}) must be above f0_male_hz ({self.f0_male_hz:g})")
        if len(set(self.poles)) < 2:
            raise ValueError(f"poles must name at least two content poles, got {self.poles}")
        return self


class Generate(Section):
    enabled: bool = False
    languages: list[Lang] = list(LANGUAGES)
    candidates_per_seed: PositiveInt = 3
    per_cell: PositiveInt = 10
    min_judges: PositiveInt | None = None
    min_naturalness: float = 3.5
    #: a YAML file of extra seeds (bank format) besides the bank's own themes
    seeds: str | None = None
    cache_dir: str | None = None
    max_tokens: PositiveInt = 800
    judge_max_tokens: PositiveInt = 300
    writer: LLMEndpoint
    judges: list[LLMEndpoint]


class Acoustics(Section):
    pitch_range: dict[Gender, tuple[float, float]]
    time_step: Annotated[float, Field(gt=0.0)] = 0.01
    formant_method: Literal["dap", "burg"] = "dap"
    max_formant: dict[Gender, float]
    neutral_pitch_range: tuple[float, float] = (60.0, 500.0)
    neutral_max_formant: Annotated[float, Field(gt=0.0)] = 5500.0
    octave_check_st: Annotated[float, Field(ge=0.0, lt=6.0)] = 2.0
    #: the femininity composite's formant term: vtl_index (F3-F4, robust to F0) or formant_index
    #: (F1-F3, the S2S paper's, sec. 4); docs/instrument.md, "The femininity composite"
    formant_term: Literal["vtl_index", "formant_index"] = "vtl_index"
    classifier: ClassifierName | list[ClassifierName] = "acoustic_norms"
    classifier_weights: dict[ClassifierName, str] = {}
    classifier_batch_size: PositiveInt | None = None
    #: the class order of a checkpoint whose config names its labels generically (LABEL_0, LABEL_1),
    #: from its model card: {name: {female: i, male: j}}
    classifier_labels: dict[ClassifierName, dict[Gender, Annotated[int, Field(ge=0)]]] = {}
    bandwidths: Literal["hawks_miller", "measured"] = "hawks_miller"
    cpps_time_step: Annotated[float, Field(gt=0.0)] = 0.002
    max_duration_s: Annotated[float, Field(gt=0.0)] = 600.0
    max_clipped_fraction: Prob = 0.001
    silence_dbfs: float = -60.0
    speaker_embedding: Literal["resemblyzer", "ecapa"] = "resemblyzer"
    speaker_embedding_weights: str | None = None
    #: ECAPA clips per padded batch (default 8 on a GPU, 1 on the CPU); embeddings do not depend on it
    speaker_embedding_batch_size: PositiveInt | None = None

    @field_validator("classifier_labels")
    @classmethod
    def _both_labels(cls, v: dict) -> dict:
        for name, order in v.items():
            if set(order) != set(GENDERS) or len(set(order.values())) != 2:
                raise ValueError(
                    f"classifier_labels.{name} needs distinct class indices for female and male, got {order}"
                )
        return v


class TextControl(Section):
    enabled: bool = True
    backend: Literal["espeak"] = "espeak"
    voices: dict[Lang, str]
    rate_wpm: PositiveInt | None = None


class AcousticScoring(Section):
    text_control: TextControl


class CarrierGate(Section):
    alpha: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.05
    strict: bool = False
    measures: list[str]


class Run(Section):
    systems: list[str]
    sc_systems: list[str] = []
    #: answers drawn per item (stimulus) from each speech-to-speech system in the respond
    #: stage; sample s has its own seed (voicebias.systems.base.sample_seed), sample 0 the
    #: run's own, so 1 is a run without repeats (docs/repeats.md)
    samples_per_item: int = 1
    #: per system x task, the largest share of failed calls that still lets the respond (and
    #: sc_continue) stage succeed, the failures then counted exclusions; above it the stage stops
    #: with one line naming the system, the task, the count and the commonest reasons
    max_failed_fraction: Prob = 0.05
    #: a speech-to-speech reply more than this many times as long as its stimulus is excluded
    #: as too_long (a reply looping its answer); null: no such limit (voicebias.systems.screen)
    max_reply_ratio: Annotated[float, Field(gt=0.0)] | None = 4.0
    #: per served or API system x task, how many answered requests are sent again once the run is
    #: done and compared with their cached replies (text, and audio by hash); the agreement goes to
    #: the card and MLflow, and a system below 100 % is flagged (voicebias.systems.runner.probe_determinism).
    #: 0: no probe. Systems run in-process (the reference systems) are not probed.
    determinism_probe: Annotated[int, Field(ge=0)] = 8
    #: whole-run replicates: the calls of `replicate_tasks` are made this many times in all, run 0
    #: being the run itself and run r >= 1 the same requests under the base seed
    #: replicate_seed(base.seed, r) (voicebias.systems.base); the replicates stage gives each
    #: cell's min, median, max, SD and CV over the runs beside the run's item CIs (docs/repeats.md,
    #: "Whole-run replicates"). 1: no replicates.
    replicates: Annotated[int, Field(ge=1)] = 1
    #: the tasks the replicates repeat, each one of tasks.names; empty: every task of tasks.names
    replicate_tasks: list[TaskName] = []

    @field_validator("samples_per_item", mode="before")
    @classmethod
    def _at_least_one_sample(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("expected a whole number of answers per item (1, 2, 3, ...)")
        if value < 1:
            raise ValueError("must be at least 1: the number of answers drawn per item (1 = one answer, no repeats)")
        return value


class SCJudge(Section):
    backend: Literal["lexical_heuristic", "openai_compatible", "gemini", "local_transformers"] = "lexical_heuristic"
    model: str | None = None
    base_url: Url | None = None
    api_key_env: EnvName | None = None
    weights: str | None = None
    device: str = "cpu"
    max_concurrency: PositiveInt = 1
    max_attempts: PositiveInt = 3
    max_output_tokens: PositiveInt = 2048
    max_new_tokens: PositiveInt = 512
    timeout_s: Annotated[float, Field(gt=0.0)] = 60.0
    max_retries: Annotated[int, Field(ge=0)] = 4
    retry_wait_s: Annotated[float, Field(ge=0.0)] = 2.0


class Tasks(Section):
    names: list[TaskName]


class Analyze(Section):
    confidence: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.95


class Disaggregate(Section):
    """The disaggregated table's item-level bootstrap (voicebias.analysis.disaggregated)."""

    resamples: Annotated[int, Field(ge=200)] = 2000


class Tracking(Section):
    tracking_uri: str = "sqlite:///mlruns/mlflow.db"
    experiment: str = "voicebias"


# ---------------------------------------------------------------- systems, by adapter


class SystemParams(Section):
    """Settings every adapter takes: how the runner calls it (left out of the cache key)."""

    max_concurrency: PositiveInt | None = None
    batch_size: PositiveInt | None = None
    timeout_s: Annotated[float, Field(gt=0.0)] | None = None
    retry: Retry | None = None
    breaker: Breaker | None = None
    asr: ASR | str | None = None


class PlantedPsychometric(Section):
    """A reference system's planted psychometric function on the voice continuum (docs/psychometric.md):
    logit P(female) = slope_per_st * (x - boundary_st - shift_st * [feminine]), x in st above the
    male endpoint (half the shift for a neutral passage). Rule 'content' ignores it (flat in the voice)."""

    slope_per_st: Annotated[float, Field(ge=0.0)] = 1.2
    boundary_st: float = 4.5
    shift_st: float = 0.0


class ReferenceParams(SystemParams):
    """Planted-truth speech-to-speech system (voicebias.systems.reference)."""

    rule: Literal["voice", "content", "mixed"]
    error_rate: Prob = 0.0
    noncompliance_rate: Prob = 0.0
    neutral_p_female: Prob = 0.5
    content_weight: Prob | None = None
    drift_st: float = 0.0
    #: planted between-voice variation: input voice (voice_id) -> its own error rate, in place of error_rate
    voice_error_rates: dict[str, Prob] = {}
    #: planted misbehaviour: the probability of each faulty reply (voicebias.systems.reference.FAULTS)
    faults: dict[Literal[FAULTS], Prob] = {}
    #: tasks answered with one and the same reply for every item
    same_answer_tasks: list[TaskName] = []
    #: the planted psychometric function on the voice continuum (unset: PlantedPsychometric's defaults)
    psychometric: PlantedPsychometric | None = None

    @model_validator(mode="after")
    def _mixed_needs_weight(self) -> "ReferenceParams":
        if self.rule == "mixed" and self.content_weight is None:
            raise ValueError("rule 'mixed' needs content_weight (probability of following the content)")
        if sum(self.faults.values()) > 1.0:
            raise ValueError(f"faults: the rates add up to {sum(self.faults.values()):g}, more than 1")
        return self


class ReferenceContinuationParams(SystemParams):
    """Planted-truth continuation system (voicebias.systems.reference_continuation)."""

    regularisation: dict[Gender, Prob]
    passive_rate: dict[Gender, Prob]
    continuation_s: Annotated[float, Field(gt=0.0)] = 6.0


class Endpoint(Section):
    """One server of a system (voicebias.clients.endpoints): where, how often, how many at once."""

    url: Url
    weight: Annotated[float, Field(gt=0.0)] = 1.0
    max_concurrency: PositiveInt | None = None


class APIParams(SystemParams):
    """OpenAI audio, OpenAI-compatible endpoints and Gemini Live."""

    model: str | None = None
    voice: str | None = None
    base_url: Url | None = None
    api_key_env: EnvName | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    audio_format: str = "wav"
    prompt_role: Literal["system", "user", "developer"] = "system"
    send_seed: bool = False
    seed_in_config: bool = False
    extra_body: dict[str, Any] | None = None


class Served(Section):
    """Where a served system's requests go: one `base_url` or several `endpoints` (voicebias.clients.endpoints)."""

    base_url: Url | None = None
    endpoints: Annotated[list[Endpoint], Field(min_length=1)] | None = None

    @model_validator(mode="after")
    def _one_address(self) -> "Served":
        if self.endpoints and self.base_url:
            raise ValueError("name either 'base_url' or 'endpoints', not both")
        return self


class OpenAIParams(Served, APIParams):
    """OpenAI audio and OpenAI-compatible endpoints: one `base_url` or several `endpoints`."""


class QwenOmniParams(SystemParams):
    """Qwen2.5-Omni through transformers (local weights)."""

    weights: str | None = None
    device: str = "cuda"
    speaker: str | None = None
    voice: str | None = None
    temperature: float | None = None
    thinker_max_new_tokens: PositiveInt = 512
    talker_max_new_tokens: PositiveInt | None = None
    talker_do_sample: bool | None = None


#: the fields of vLLM's SamplingParams a request's sampling_params_list may set (vLLM docs, "Sampling
#: Parameters", SamplingParams in v0.8.3, and `structured_outputs`, which replaced `guided_decoding` later);
#: vLLM-Omni hands each stage's mapping to it, and an unknown key fails upstream as HTTP 500
VLLM_SAMPLING_KEYS = frozenset(
    {
        "n",
        "best_of",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "bad_words",
        "ignore_eos",
        "max_tokens",
        "min_tokens",
        "logprobs",
        "prompt_logprobs",
        "detokenize",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "truncate_prompt_tokens",
        "output_kind",
        "guided_decoding",
        "structured_outputs",
        "logit_bias",
        "allowed_token_ids",
        "extra_args",
    }
)


def sampling_key_problems(spec: Any) -> list[str]:
    """What is wrong with a sampling_params_list's keys, one line per unknown key, with the closest
    known name (so `temprature` stops before any request instead of failing every call upstream)."""
    out = []
    for i, stage in enumerate(spec if isinstance(spec, list) else []):
        for key in stage if isinstance(stage, dict) else {}:
            if key not in VLLM_SAMPLING_KEYS:
                close = difflib.get_close_matches(str(key), sorted(VLLM_SAMPLING_KEYS), n=1, cutoff=0.6)
                hint = (
                    f"; did you mean {close[0]}?"
                    if close
                    else f"; vLLM's keys: {', '.join(sorted(VLLM_SAMPLING_KEYS))}"
                )
                out.append(f"sampling_params_list[{i}]: {key!r} is not a vLLM sampling parameter{hint}")
    return out


class VLLMOmniParams(Served, SystemParams):
    """A model served by vLLM-Omni (voicebias.systems.vllm_omni): one `base_url` or several `endpoints`;
    the card holds the defaults."""

    model: str | None = None
    api_key_env: EnvName | None = None
    prompt_role: Literal["system", "user"] | None = None
    #: one vLLM SamplingParams mapping per stage, replacing the card's (the adapter adds the seeds)
    sampling_params_list: list[dict[str, Any]] | None = None
    #: deploy settings merged over the card's (e.g. batch_invariant: false for a server run without it)
    deploy: dict[str, Any] | None = None

    @field_validator("sampling_params_list")
    @classmethod
    def _known_sampling_keys(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        problems = sampling_key_problems(value)
        if problems:
            raise ValueError("; ".join(problems))
        return value


class RepositoryParams(Served, SystemParams):
    """A model run from the user's checkout of its repository, in its own environment; or served by shims
    of that driver (`base_url` or `endpoints`, else the endpoints file of `voicebias serve`)."""

    python: str | None = None
    #: a driver script of one's own replacing the shipped one (same line protocol); its sha256 is in the key
    driver: str | None = None
    checkout: str | None = None
    weights: str | None = None
    device: str = "cuda"
    command: str | list[str] | None = None
    startup_timeout_s: Annotated[float, Field(gt=0.0)] = 1800.0
    text_stream: bool | None = None
    variant: str | None = None
    voice: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: PositiveInt | None = None
    #: repository-specific sampling settings handed to the driver as they are
    sampling: dict[str, Any] | None = None
    continuation_s: Annotated[float, Field(gt=0.0)] = 6.0


ADAPTER_PARAMS: dict[str, type[SystemParams]] = {
    "reference": ReferenceParams,
    "reference_continuation": ReferenceContinuationParams,
    "openai_audio": OpenAIParams,
    "openai_compatible": OpenAIParams,
    "gemini_live": APIParams,
    "qwen_omni": QwenOmniParams,
    "vllm_omni": VLLMOmniParams,
    "kimi_audio": RepositoryParams,
    "glm4_voice": RepositoryParams,
    "step_audio2": RepositoryParams,
    "spiritlm": RepositoryParams,
    "speechgpt": RepositoryParams,
    "vae_gslm": RepositoryParams,
}


class Params(Section):
    """The whole of params.yaml."""

    base: Base
    bank: Bank
    tts: TTS
    sc_stimuli: SCStimuli
    phonation: Phonation
    continuum: Continuum = Continuum()
    generate: Generate
    acoustics: Acoustics
    acoustic_scoring: AcousticScoring
    carrier_gate: CarrierGate
    run: Run
    systems: dict[str, dict[str, Any]]
    sc_judge: SCJudge = SCJudge()
    tasks: Tasks
    analyze: Analyze = Analyze()
    disaggregate: Disaggregate = Disaggregate()
    tracking: Tracking = Tracking()

    @model_validator(mode="after")
    def _replicated_tasks_are_run(self) -> "Params":
        extra = [t for t in self.run.replicate_tasks if t not in self.tasks.names]
        if extra:
            raise ValueError(
                f"run.replicate_tasks names {', '.join(extra)}, not in tasks.names ({', '.join(self.tasks.names)}): "
                "a replicate repeats calls of the run"
            )
        return self


def replicate_tasks(params: dict[str, Any]) -> list[str]:
    """The tasks the whole-run replicates repeat (run.replicate_tasks, or every task of tasks.names),
    none when run.replicates is 1."""
    run = params.get("run") or {}
    if int(run.get("replicates", 1)) < 2:
        return []
    return list(run.get("replicate_tasks") or params["tasks"]["names"])


# ---------------------------------------------------------------- validation


class ParamsError(VoicebiasError, ValueError):
    """params.yaml holds an unknown key, a wrong type or a missing required setting."""


_TYPE_WORDS = {
    "float_parsing": "a number",
    "float_type": "a number",
    "int_parsing": "an integer",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "bool_parsing": "true or false",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "tuple_type": "a [low, high] pair",
    "model_attributes_type": "a mapping",
}


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The section class that holds the last key of `loc` (for 'did you mean')."""
    cur: Any = model
    for part in loc[:-1]:
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)) or part not in cur.model_fields:
            return None
        ann = cur.model_fields[part].annotation
        candidates = [a for a in getattr(ann, "__args__", (ann,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        cur = candidates[0] if candidates else None
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def _messages(exc: ValidationError, model: type[BaseModel], prefix: tuple[str, ...]) -> list[str]:
    out = []
    seen = set()
    for err in exc.errors():
        # union members repeat one failure per alternative; report the key once
        loc = tuple(
            str(p)
            for p in err["loc"]
            if not (
                isinstance(p, str)
                and (
                    "[" in p
                    or p in {"str", "list[str]", "int", "float", "bool", "constrained-int", "constrained-float"}
                )
            )
        )
        path = ".".join(prefix + loc)
        if path in seen:
            continue
        seen.add(path)
        kind = err["type"]
        if kind == SECRET_ERROR:  # never repeat the value
            out.append(f"{path}: {err['msg']}")
        elif kind == "extra_forbidden":
            holder = _model_at(model, loc)
            hint = ""
            if holder is not None:
                close = difflib.get_close_matches(loc[-1], list(holder.model_fields), n=1, cutoff=0.6)
                if close:
                    hint = f"; did you mean {close[0]}?"
                else:
                    hint = f"; known keys: {', '.join(holder.model_fields)}"
            out.append(f"{path}: unknown key{hint}")
        elif kind == "missing":
            out.append(f"{path}: required setting is missing")
        elif kind in _TYPE_WORDS:
            out.append(f"{path}: expected {_TYPE_WORDS[kind]}, got {err.get('input')!r}")
        elif kind == "literal_error":
            out.append(f"{path}: {err.get('input')!r} is not one of {err['ctx']['expected']}")
        else:
            out.append(f"{path}: {err['msg'].removeprefix('Value error, ')} (got {err.get('input')!r})")
    return out


def validate_section(model: type[Section], data: Any, path: str, exclude_none: bool = False) -> dict[str, Any]:
    """One section (e.g. `sc_judge`, or a system's settings) checked and with its defaults filled in."""
    try:
        return model.model_validate(data if data is not None else {}).model_dump(exclude_none=exclude_none)
    except ValidationError as exc:
        lines = _messages(exc, model, tuple(path.split(".")))
        raise ParamsError("; ".join(lines)) from None


def samples_per_item(params: dict[str, Any]) -> int:
    """`run.samples_per_item` of a parameter mapping (the schema's default where the mapping has none)."""
    return int(validate_section(Run, params.get("run"), "run")["samples_per_item"])


def max_failed_fraction(params: dict[str, Any]) -> float:
    """`run.max_failed_fraction` of a parameter mapping (the schema's default where the mapping has none)."""
    return float(validate_section(Run, params.get("run"), "run")["max_failed_fraction"])


def validate_system(name: str, adapter: str, data: Any) -> dict[str, Any]:
    """A system's settings checked against its adapter's schema (unset optional keys stay absent)."""
    if adapter not in ADAPTER_PARAMS:
        raise ParamsError(f"systems.{name}: no settings schema for adapter {adapter!r}")
    return validate_section(ADAPTER_PARAMS[adapter], data, f"systems.{name}", exclude_none=True)


def _card_adapter(system: str, cards_dir: Path) -> str:
    path = Path(cards_dir) / f"{system}.yaml"
    if not path.exists():
        raise ParamsError(f"systems.{system}: no system card {path}")
    card = read_yaml(path) or {}
    adapter = card.get("adapter") if isinstance(card, dict) else None
    if adapter not in ADAPTER_PARAMS:
        raise ParamsError(
            f"systems.{system}: card {path} names adapter {adapter!r}; known: {', '.join(ADAPTER_PARAMS)}"
        )
    return adapter


def validate_params(raw: Any, cards_dir: Path | None = None, source: str = "params.yaml") -> dict[str, Any]:
    """Check a params mapping against the schema; return it with every default filled in.

    Raises :class:`ParamsError` listing every problem, one line each, with its key path.
    """
    if cards_dir is None:
        cards_dir = CARDS_DIR
    if not isinstance(raw, dict):
        raise ParamsError(f"{source} does not hold a mapping of parameter sections")
    problems: list[str] = []
    try:
        params = Params.model_validate(raw).model_dump()
    except ValidationError as exc:
        problems += _messages(exc, Params, ())
        params = None
    systems_out: dict[str, Any] = {}
    for name, spec in (raw.get("systems") or {}).items():
        if not isinstance(spec, dict):
            problems.append(f"systems.{name}: expected a mapping, got {spec!r}")
            continue
        if not (Path(cards_dir) / f"{name}.yaml").exists():
            # no card, no adapter to check against: kept as written; building the system
            # (voicebias.systems.build.build_from) stops on the missing card and validates then
            systems_out[name] = spec
            continue
        try:
            model = ADAPTER_PARAMS[_card_adapter(name, cards_dir)]
        except ParamsError as exc:
            problems.append(str(exc))
            continue
        try:
            systems_out[name] = model.model_validate(spec).model_dump(exclude_none=True)
        except ValidationError as exc:
            problems += _messages(exc, model, ("systems", name))
    run = raw.get("run") if isinstance(raw.get("run"), dict) else {}
    for key in ("systems", "sc_systems"):
        for name in run.get(key) or []:
            if isinstance(name, str) and name not in (raw.get("systems") or {}):
                problems.append(f"run.{key}: '{name}' has no section systems.{name}")
    if problems:
        raise ParamsError(f"{source}: {len(problems)} problem(s):\n  " + "\n  ".join(problems))
    params["systems"] = systems_out
    return params


def load_params(path: Path | str | None = None) -> dict[str, Any]:
    """Read params.yaml (or another profile file), validated against the schema.

    Returns a plain dict with every default filled in (voicebias.params); an unknown
    key, a wrong type or a missing setting raises ParamsError naming the key path.
    """
    p = Path(path) if path else PARAMS
    if not p.exists():
        raise FileNotFoundError(f"parameter file not found: {p}")
    raw = read_yaml(p)
    return validate_params(raw, source=p.name)


def stage_params(stage: str) -> dict[str, Any]:
    """params.yaml validated for a stage; a schema problem prints its key paths and exits 1."""
    from voicebias.errors import guarded

    return guarded(load_params, stage=stage)
