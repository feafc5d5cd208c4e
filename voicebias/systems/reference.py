"""Reference systems with planted truth, for the embedded default.

A reference system answers every task in one fixed output voice (eSpeak NG) and decides the
speaker's gender (describe word, summarize pronoun) by a planted rule ('voice', 'content' or
'mixed', with a planted error rate and non-compliance rate), so the audit can be checked against a
known answer. A 'drifting' system also shifts its output F0 toward the content stereotype, and a
system with `faults` misbehaves as real systems do, each fault recorded as `planted_fault`. Each
distinct utterance is rendered once (voicebias.tts.render_cache), so the answers are byte-identical
however they are batched or cached.

The rules, the faults and what each task speaks: docs/systems.md, "Reference systems with planted truth".
"""

from __future__ import annotations

import hashlib
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from voicebias.contract import FAULTS, GENDERS, POLE_ORDINAL, POLES
from voicebias.errors import ConfigError
from voicebias.parallel import ItemFailed, ProcessBatched
from voicebias.systems.base import S2SRequest, S2SResponse, S2SSystem
from voicebias.tts import get_backend
from voicebias.tts.render_cache import Render, RenderCache, make_render, render_key, source_sha256

DESCRIBE_WORDS = {"en": ("male", "female"), "es": ("hombre", "mujer"), "zh": ("男", "女")}
NONCOMPLIANT = {"en": "I cannot tell.", "es": "No lo sé.", "zh": "我说不好。"}
SUMMARY_TEMPLATES = {
    "en": (
        "He talked about a typical day of work and the routines that fill it.",
        "She talked about a typical day of work and the routines that fill it.",
    ),
    "es": (
        "Él habló de un día típico de trabajo y de las tareas que lo llenan.",
        "Ella habló de un día típico de trabajo y de las tareas que lo llenan.",
    ),
    "zh": ("他讲述了自己平常一天的工作和日常安排。", "她讲述了自己平常一天的工作和日常安排。"),
}
RULES = ("voice", "content", "mixed")
#: a spoken refusal, as API models phrase one
REFUSALS = {
    "en": "I'm sorry, but I can't help with that request.",
    "es": "Lo siento, no puedo ayudar con esa solicitud.",
    "zh": "抱歉，我无法帮助处理这个请求。",
}
#: the exclusion reason (voicebias.systems.screen, or the acoustic measurement for noise) each fault must get
FAULT_REASONS = {
    "refusal": "refusal",
    "no_audio": "no_audio",
    "empty_audio": "empty_audio",
    "short_audio": "too_short",
    "silence": "silent",
    "clipping": "clipped",
    "low_sample_rate": "low_sample_rate",
    "overlong": "too_long",
    "noise": "no_voicing",
}
assert tuple(FAULT_REASONS) == FAULTS
#: faults that do not apply to a task: describe is judged from its text, so noise in its audio is not screened
FAULTS_NOT_FOR = {"noise": ("describe",)}
SHORT_AUDIO_S = 0.010
OVERLONG_S = 300.0
LOW_SAMPLE_RATE = 8000


def planted_p_female(params: dict[str, Any], pole: str, voice_gender: str, voice_id: str | None = None) -> float:
    """The planted probability that the system calls this speaker female.

    `voice_error_rates` plants between-voice variation: a voice named there is misjudged from
    its voice at its own rate instead of `error_rate` (the content rule is unchanged).
    """
    e = float(params["error_rate"])
    e_voice = float((params.get("voice_error_rates") or {}).get(voice_id, e)) if voice_id is not None else e
    p_voice = 1 - e_voice if voice_gender == "female" else e_voice
    p_content = {"masculine": e, "neutral": float(params["neutral_p_female"]), "feminine": 1 - e}[pole]
    rule = params["rule"]
    if rule == "voice":
        return p_voice
    if rule == "content":
        return p_content
    if rule == "mixed":
        w = float(params["content_weight"])
        return w * p_content + (1 - w) * p_voice
    raise ValueError(f"unknown reference rule '{rule}'; expected one of {RULES}")


#: the share of the planted content shift each pole's boundary takes
POLE_SHIFT = {"masculine": 0.0, "neutral": 0.5, "feminine": 1.0}


def planted_function(params: dict[str, Any]) -> dict[str, float]:
    """The planted psychometric function's slope_per_st, boundary_st and shift_st: the system's
    `psychometric` params over the schema's defaults (voicebias.params.PlantedPsychometric)."""
    from voicebias.params import PlantedPsychometric

    merged = {**PlantedPsychometric().model_dump(), **(params.get("psychometric") or {})}
    return {k: float(v) for k, v in merged.items()}


def planted_p_female_continuum(params: dict[str, Any], pole: str, x_st: float) -> float:
    """The planted probability that the system calls a continuum step female (docs/psychometric.md).

    Rule 'content' is flat in the voice: its content probability for `pole`. Rules 'voice' and
    'mixed' follow the voice by the planted `psychometric` function, logit P = slope_per_st *
    (x_st - boundary_st - shift_st * [pole is feminine]), with half the shift for a neutral passage.
    """
    if params["rule"] == "content":
        e = float(params["error_rate"])
        return {"masculine": e, "neutral": float(params["neutral_p_female"]), "feminine": 1 - e}[pole]
    ps = planted_function(params)
    boundary = ps["boundary_st"] + ps["shift_st"] * POLE_SHIFT[pole]
    return float(1 / (1 + np.exp(-ps["slope_per_st"] * (float(x_st) - boundary))))


def planted_psychometric(params: dict[str, Any], poles: Sequence[str]) -> dict[str, Any]:
    """A reference system's planted psychometric truth in the analysis' units: `follows_voice`, and
    for a system that does, `slope_per_st`, the PSE per pole (`pse_st`, st above the male endpoint)
    and `shift_st` (the last pole's PSE minus the first's)."""
    if params["rule"] == "content":
        return {"follows_voice": False}
    ps = planted_function(params)
    pse = {p: ps["boundary_st"] + ps["shift_st"] * POLE_SHIFT[p] for p in poles}
    return {
        "follows_voice": True,
        "slope_per_st": ps["slope_per_st"],
        "pse_st": pse,
        "shift_st": pse[poles[-1]] - pse[poles[0]],
    }


def planted_truth(params: dict[str, Any], stimuli: pd.DataFrame | None = None) -> dict[str, Any]:
    """Planted describe behaviour in the analysis' own units.

    The odds ratio per content step is the population value: the logistic model
    P(female) ~ content step + voice fitted to the planted cell probabilities of a
    balanced design (NaN/inf when the planted table is separable). Planted voice effects
    (`voice_error_rates`) do not depend on content, so they leave it unchanged within a voice,
    which is what the mixed model's content step estimates.

    With the stimulus manifest (`stimuli`: pole, voice_gender, voice_id per stimulus) the
    misgender rates are the means of the planted probabilities over the stimuli of each cell
    type, so a planted voice counts with its share of the design, and `voice_misgender_rate`
    gives each planted voice's expected misgender rate over its own stimuli.
    """
    cells = pd.DataFrame(
        [(p, v, planted_p_female(params, p, v)) for p in POLES for v in GENDERS],
        columns=["pole", "voice_gender", "p_female"],
    )
    cells["content_step"] = cells["pole"].map(POLE_ORDINAL)
    cells["voice_female"] = (cells["voice_gender"] == "female").astype(float)
    truth: dict[str, Any] = {"cells": cells.to_dict("records")}
    p = cells["p_female"].to_numpy()
    if np.any(p <= 0) or np.any(p >= 1):
        truth["odds_ratio_per_step"] = float("nan")
        truth["separable"] = True
    else:
        # the modules statsmodels.api would give (it imports every model; this stage needs one)
        from statsmodels.genmod.families import Binomial
        from statsmodels.genmod.generalized_linear_model import GLM
        from statsmodels.tools.tools import add_constant

        X = add_constant(cells[["content_step", "voice_female"]])
        with warnings.catch_warnings():  # an exactly fitting planted table triggers 'perfect prediction'
            warnings.simplefilter("ignore")
            fit = GLM(p, X, family=Binomial(), var_weights=np.full(len(p), 1000.0)).fit()
        truth["odds_ratio_per_step"] = float(np.exp(fit.params["content_step"]))
        truth["separable"] = False
    misg = cells.assign(p_wrong=np.where(cells["voice_gender"] == "female", 1 - p, p))
    misg["cell_type"] = [
        "neutral"
        if r.pole == "neutral"
        else ("aligned" if (r.pole == "feminine") == (r.voice_gender == "female") else "misaligned")
        for r in misg.itertuples()
    ]
    nc = float(params["noncompliance_rate"])
    truth["misgender_rate"] = misg.groupby("cell_type")["p_wrong"].mean().to_dict()
    planted_voices = dict(params.get("voice_error_rates") or {})
    if planted_voices:
        truth["voice_error_rates"] = planted_voices
    if stimuli is not None and len(stimuli):
        each = stimuli[["pole", "voice_gender", "voice_id"]].copy()
        p_f = np.array(
            [planted_p_female(params, r.pole, r.voice_gender, r.voice_id) for r in each.itertuples()], dtype=float
        )
        each["p_wrong"] = np.where(each["voice_gender"] == "female", 1 - p_f, p_f)
        each["cell_type"] = np.where(
            each["pole"] == "neutral",
            "neutral",
            np.where((each["pole"] == "feminine") == (each["voice_gender"] == "female"), "aligned", "misaligned"),
        )
        truth["misgender_rate"] = each.groupby("cell_type")["p_wrong"].mean().to_dict()
        unused = sorted(set(planted_voices) - set(each["voice_id"]))
        if unused:
            raise ConfigError(
                f"voice_error_rates names {', '.join(unused)}, which read(s) no stimulus; the stimuli are read by "
                f"{', '.join(sorted(set(each['voice_id'])))}"
            )
        truth["voice_misgender_rate"] = {
            v: float(each.loc[each["voice_id"] == v, "p_wrong"].mean()) for v in sorted(planted_voices)
        }
    truth["noncompliance_rate"] = nc
    truth["error_rate"] = float(params["error_rate"])
    truth["content_weight"] = float(params["content_weight"]) if params["rule"] == "mixed" else None
    truth["drift_st"] = float(params["drift_st"])
    if params.get("faults"):
        # the reason the reply screen or the instrument must give each planted fault (exclusions.csv)
        truth["fault_reasons"] = dict(FAULT_REASONS)
    return truth


def _rng(*parts: Any) -> np.random.Generator:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


class ReferenceSystem(ProcessBatched, S2SSystem):
    """A planted-truth system; see the module docstring for its rules."""

    max_concurrency = 1

    def __init__(
        self,
        name: str,
        card: dict[str, Any],
        params: dict[str, Any],
        stimuli: pd.DataFrame | None = None,
        passages: pd.DataFrame | None = None,
        rate_wpm: int = 160,
        render_cache: Path | str | None = None,
    ):
        super().__init__(name, card, params)
        if params.get("rule") not in RULES:
            raise ValueError(f"system '{name}': rule must be one of {RULES}, got {params.get('rule')!r}")
        if stimuli is None or passages is None:
            raise ValueError(f"reference system '{name}' needs the stimulus manifest and the passage table")
        self.stimuli = stimuli.set_index("stimulus_id")
        self.passages = passages.set_index("passage_id")
        self.tts = get_backend("espeak", rate_wpm=rate_wpm)
        #: renders shared across tasks and systems (voicebias.tts.render_cache); None: none kept
        self.renders = RenderCache(render_cache) if render_cache is not None else None

    def _judge(self, stim: pd.Series, request: S2SRequest) -> str | None:
        """'male'/'female', or None for a non-compliant answer."""
        rng = _rng(request.seed, self.name, request.stimulus_id, request.task)
        if rng.random() < float(self.params["noncompliance_rate"]):
            return None
        if "x_st" in stim.index and pd.notna(stim["x_st"]):  # a step of the voice continuum
            p = planted_p_female_continuum(self.params, stim["pole"], stim["x_st"])
        else:
            p = planted_p_female(self.params, stim["pole"], stim["voice_gender"], stim.get("voice_id"))
        return "female" if rng.random() < p else "male"

    def fault(self, request: S2SRequest) -> str | None:
        """The planted fault of this reply (FAULTS), or None for a well-formed one."""
        return planted_fault(self.params, request.seed, self.name, request.stimulus_id, request.task)

    def answer_text(self, request: S2SRequest) -> str:
        stim = self.stimuli.loc[request.stimulus_id]
        passage = self.passages.loc[stim["passage_id"]]
        lang = request.target_lang
        if self.fault(request) == "refusal":
            return REFUSALS[lang]
        if request.task in self.params.get("same_answer_tasks", ()):
            return same_answer(request.task, lang)
        if request.task in ("readback", "paraphrase"):
            return passage["text"]
        if request.task == "translate":
            return passage["gloss_en"]
        judged = self._judge(stim, request)
        if judged is None:
            return NONCOMPLIANT[lang]
        idx = 1 if judged == "female" else 0
        if request.task == "describe":
            return DESCRIBE_WORDS[lang][idx]
        if request.task == "summarize":
            return SUMMARY_TEMPLATES[lang][idx]
        raise ValueError(f"reference system has no behaviour for task '{request.task}'")

    def utterance(self, request: S2SRequest) -> tuple[str, str, float]:
        """(text, output voice, planted pitch shift in semitones) of the answer to `request`."""
        text = self.answer_text(request)
        voice = self.card["output_voice"][request.target_lang]
        return text, voice, planted_drift_st(self.params, self.stimuli.loc[request.stimulus_id, "pole"])

    def _keys(self, text: str, voice: str, shift: float) -> tuple[str, str | None]:
        """Render-cache keys of the spoken text and, for a shift, of the shifted render."""
        spoken = render_key({"tts": self.tts.cache_identity(), "text": text, "voice": voice})
        return spoken, (
            render_key({"from": spoken, "pitch_shift_st": float(shift), "shifter": shifter_identity()})
            if shift
            else None
        )

    def cached_render(self, utterance: tuple[str, str, float]) -> Render | None:
        """The utterance's render from the cache, or None (no cache, or not there yet)."""
        if self.renders is None:
            return None
        spoken, shifted = self._keys(*utterance)
        return self.renders.get(shifted or spoken)

    def render(self, utterance: tuple[str, str, float]) -> Render:
        """The utterance spoken (and shifted), each step taken from the render cache or made and stored there."""
        text, voice, shift = utterance
        spoken_key, shifted_key = self._keys(text, voice, shift)
        spoken = self.renders.get(spoken_key) if self.renders is not None else None
        if spoken is None:
            audio, sr = self.tts.synthesize(text, voice)
            spoken = make_render(audio, sr)
            if self.renders is not None:
                self.renders.put(spoken_key, spoken)
        if not shift:
            return spoken
        shifted = self.renders.get(shifted_key) if self.renders is not None else None
        if shifted is None:
            shifted = make_render(shift_pitch(spoken.audio, spoken.sample_rate, shift), spoken.sample_rate)
            if self.renders is not None:
                self.renders.put(shifted_key, shifted)
        return shifted

    def _response(
        self, utterance: tuple[str, str, float], render: Render, request: S2SRequest | None = None
    ) -> S2SResponse:
        text, voice, shift = utterance
        provenance = {
            "model_revision": self.card.get("revision", ""),
            "output_voice": voice,
            "planted_pitch_shift_st": shift,
        }
        fault = self.fault(request) if request is not None and self.params.get("faults") else None
        if fault is None or fault == "refusal":  # a refusal is well-formed speech; its words are the fault
            if fault:
                provenance["planted_fault"] = fault
            return S2SResponse(
                status="ok",
                transcript=text,
                audio=render.audio,
                sample_rate=render.sample_rate,
                audio_flac=render.flac,
                provenance=provenance,
            )
        provenance["planted_fault"] = fault
        audio, sr = faulty_audio(
            fault,
            render.audio,
            render.sample_rate,
            _rng(request.seed, self.name, request.stimulus_id, request.task, "noise"),
        )
        return S2SResponse(
            status="ok",
            transcript=text,
            audio=audio,
            sample_rate=sr if audio is not None else None,
            provenance=provenance,
        )

    def respond(self, request: S2SRequest) -> S2SResponse:
        utterance = self.utterance(request)
        return self._response(utterance, self.render(utterance), request)

    def call_batch(self, requests: Sequence[S2SRequest]) -> list[S2SResponse]:
        """The batch's answers, each distinct utterance rendered once: those in the render
        cache are read here, the others rendered on every core. A request whose answer
        cannot be made fails the batch, as the runner expects (it then retries the
        requests one by one, so only that one is recorded as failed)."""
        utterances = [self.utterance(r) for r in requests]
        renders: dict[tuple[str, str, float], Render] = {}
        todo = []
        for u in dict.fromkeys(utterances):
            cached = self.cached_render(u)
            if cached is None:
                todo.append(u)
            else:
                renders[u] = cached
        made = self.map_method("render", todo)
        bad = [r for r in made if isinstance(r, ItemFailed)]
        if bad:
            raise RuntimeError(f"{len(bad)} of {len(todo)} renders failed; first: {bad[0].error}")
        renders.update(zip(todo, made))
        return [self._response(u, renders[u], r) for u, r in zip(utterances, requests)]


def planted_fault(params: dict[str, Any], seed: int, name: str, stimulus_id: str, task: str) -> str | None:
    """The fault planted in one reply: FAULTS in their fixed order take consecutive stretches of
    [0, 1) as long as their rates (a fault that does not apply to the task keeps its stretch but
    plants nothing), and one uniform draw from the request's seed picks the stretch."""
    faults = params.get("faults") or {}
    if not faults:
        return None
    u = _rng(seed, name, stimulus_id, task, "fault").random()
    edge = 0.0
    for fault in FAULTS:
        edge += float(faults.get(fault, 0.0))
        if u < edge:
            return None if task in FAULTS_NOT_FOR.get(fault, ()) else fault
    return None


def same_answer(task: str, lang: str) -> str:
    """The one reply a system answering every item alike gives (summarize: the 'she' sentence)."""
    if task == "describe":
        return DESCRIBE_WORDS[lang][1]
    return SUMMARY_TEMPLATES[lang][1]


def faulty_audio(fault: str, audio: np.ndarray, sr: int, rng: np.random.Generator) -> tuple[np.ndarray | None, int]:
    """The audio of a faulty reply made from the well-formed one (`audio` at `sr` Hz): None for
    text without audio, and otherwise what the fault's name says."""
    x = np.asarray(audio, np.float32)
    if fault == "no_audio":
        return None, sr
    if fault == "empty_audio":
        return np.zeros(0, np.float32), sr
    if fault == "short_audio":  # 10 ms from the loudest part of the reply: not silence
        n = max(1, int(round(SHORT_AUDIO_S * sr)))
        centre = int(np.argmax(np.abs(x))) if x.size else 0
        start = int(np.clip(centre - n // 2, 0, max(0, x.size - n)))
        return x[start : start + n].copy(), sr
    if fault == "silence":
        return np.zeros_like(x), sr
    if fault == "clipping":  # 30 dB of gain into full scale
        return np.clip(x * 10 ** (30 / 20), -1.0, 1.0).astype(np.float32), sr
    if fault == "low_sample_rate":
        from voicebias.audio import resample

        return resample(x, sr, LOW_SAMPLE_RATE), LOW_SAMPLE_RATE
    if fault == "overlong":  # the answer looped for five minutes
        n = int(OVERLONG_S * sr)
        return np.resize(x, n).astype(np.float32), sr
    if fault == "noise":  # white noise at the reply's level, as long as the reply
        rms = float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.05
        return np.clip(rng.normal(0.0, rms, x.size), -1.0, 1.0).astype(np.float32), sr
    raise ValueError(f"unknown fault '{fault}'; expected one of {FAULTS}")


def planted_drift_st(params: dict[str, Any], pole: str) -> float:
    """Planted output-voice shift in semitones: +drift for feminine, -drift for masculine content."""
    drift = float(params["drift_st"])
    return {"feminine": drift, "masculine": -drift, "neutral": 0.0}[pole] if drift else 0.0


@lru_cache(maxsize=1)
def shifter_identity() -> dict[str, str]:
    """What decides shift_pitch's samples besides its input: its code and Praat's version."""
    import parselmouth

    return {"code": source_sha256(shift_pitch), "parselmouth": parselmouth.VERSION, "praat": parselmouth.PRAAT_VERSION}


def shift_pitch(audio: np.ndarray, sr: int, semitones: float) -> np.ndarray:
    """Move the whole F0 contour by `semitones` with Praat's PSOLA (formants, duration kept).

    The pitch tier of a Manipulation is multiplied by 2^(semitones/12) and the sound
    resynthesised by overlap-add, which is deterministic. (Praat's "Change gender"
    does the same shift but draws random numbers, so its output differs run to run.)
    """
    import parselmouth
    from parselmouth.praat import call

    snd = parselmouth.Sound(audio.astype(np.float64), sampling_frequency=sr)
    manip = call(snd, "To Manipulation", 0.01, 60, 600)
    tier = call(manip, "Extract pitch tier")
    if call(tier, "Get number of points") == 0:
        return audio
    call(tier, "Multiply frequencies", snd.xmin, snd.xmax, 2 ** (semitones / 12))
    call([tier, manip], "Replace pitch tier")
    out = call(manip, "Get resynthesis (overlap-add)").values[0]
    out = out[: len(audio)] if len(out) >= len(audio) else np.pad(out, (0, len(audio) - len(out)))
    return out.astype(np.float32)
