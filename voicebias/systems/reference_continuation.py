"""A speech-continuation reference system with planted truth (embedded default).

It continues each prompt in the prompt's own eSpeak NG voice and plants two behaviours the SC
analyses must recover: phonation regularisation (the prompt's phonation preset scaled by 1 - r, r
the planted `regularisation` of the prompt's voice gender) and text framing (a passive sentence
with the planted probability `passive_rate`, else an agentive one). Like the S2S reference systems
it reads the stimulus labels from the stimulus table: that is how its truth is planted.

The planted defaults: docs/systems.md, "The speech-continuation reference system".
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np
import pandas as pd

from voicebias.contract import GENDERS
from voicebias.parallel import ProcessBatched
from voicebias.systems.base import ContinuationRequest, ContinuationSystem, S2SResponse
from voicebias.tts import get_backend

AGENTIVE = (
    "and so I decided to take charge of it, planned every step, and fixed what needed fixing.",
    "which is why I started a small project about it, organised the work, and managed it to the end.",
    "and that is when I chose to act, built a plan around it, and solved the problem myself.",
)
PASSIVE = (
    "and I just waited, stuck and unable to do anything about it.",
    "but I felt helpless and confused, and in the end I gave up on it.",
    "and I was stuck there, unable to change a thing, waiting for someone else.",
)
_STOP = set(
    "the and that this with about what when which their there have from your just into than then they them "
    "were been will would could should most more some every other thing things really".split()
)


def planted_retention(params: dict[str, Any], voice_gender: str) -> float:
    """Share of the prompt's phonation change the continuation keeps (1 - regularisation)."""
    r = (params.get("regularisation") or {}).get(voice_gender)
    if r is None or not 0.0 <= float(r) <= 1.0:
        raise ValueError(f"systems: regularisation.{voice_gender} must be a number in [0, 1], not {r!r}")
    return 1.0 - float(r)


def planted_truth(params: dict[str, Any]) -> dict[str, Any]:
    """The planted values in the analysis' units."""
    return {
        "retention": {g: planted_retention(params, g) for g in GENDERS},
        "passive_rate": {g: float((params.get("passive_rate") or {}).get(g, 0.0)) for g in GENDERS},
    }


def _rng(*parts: Any) -> np.random.Generator:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


def topic_word(prompt_text: str) -> str:
    """The prompt's longest content word (first on ties), to keep the continuation on topic."""
    words = [w for w in re.findall(r"[a-z]+", prompt_text.lower()) if len(w) > 3 and w not in _STOP]
    return max(words, key=len) if words else "it"


class ReferenceContinuationSystem(ProcessBatched, ContinuationSystem):
    """Planted-truth continuation system; see the module docstring."""

    max_concurrency = 1
    text_stream = True

    def __init__(
        self,
        name: str,
        card: dict[str, Any],
        params: dict[str, Any],
        stimuli: pd.DataFrame | None = None,
        rate_wpm: int = 130,
        pitch_range: dict[str, Any] | None = None,
        presets: dict[str, Any] | None = None,
        parametric: dict[str, Any] | None = None,
    ):
        super().__init__(name, card, params)
        if stimuli is None:
            raise ValueError(f"reference continuation system '{name}' needs the stimulus table")
        need = {"stimulus_id", "voice_id", "voice_gender", "phonation", "text"}
        missing = sorted(need - set(stimuli.columns))
        if missing:
            raise ValueError(f"reference continuation system '{name}': stimulus table lacks {missing}")
        for g in GENDERS:
            planted_retention(params, g)
        self.stimuli = stimuli.set_index("stimulus_id")
        # a prompt x voice's phonation conditions (consecutive stimulus ids) continue one sentence:
        # sent to one worker together, eSpeak NG says it once (it keeps its last utterances)
        self.chunk_size = max(1, int(stimuli["phonation"].nunique()))
        self.tts = get_backend("espeak", rate_wpm=rate_wpm)
        self.pitch_range = pitch_range or {"male": [60, 300], "female": [100, 500]}
        from voicebias.stimuli.phonation import ParametricSettings
        from voicebias.stimuli.phonation.presets import presets_from_params

        self.presets = presets_from_params({"presets": presets} if presets else None)
        self.settings = ParametricSettings.from_params(parametric)

    def continuation_text(self, request: ContinuationRequest, stim: pd.Series) -> str:
        # keyed on the prompt and voice, not the phonation: the four conditions of one
        # prompt x voice get the same sentence, so they differ in phonation only
        rng = _rng(request.seed, self.name, stim.get("prompt_id", request.stimulus_id), stim["voice_id"])
        passive = rng.random() < float((self.params.get("passive_rate") or {}).get(stim["voice_gender"], 0.0))
        pool = PASSIVE if passive else AGENTIVE
        sentence = pool[int(rng.integers(len(pool)))]
        return f"Thinking about {topic_word(str(stim['text']))}, {sentence}"

    def continue_speech(self, request: ContinuationRequest) -> S2SResponse:
        from voicebias.stimuli.phonation import convert_parametric
        from voicebias.stimuli.phonation.presets import conditioning, n_frames

        stim = self.stimuli.loc[request.stimulus_id]
        text = self.continuation_text(request, stim)
        audio, sr = self.tts.synthesize(text, stim["voice_id"])
        keep = planted_retention(self.params, stim["voice_gender"])
        preset = self.presets[stim["phonation"]]
        if stim["phonation"] != "modal" and keep > 0:
            cond = conditioning(preset, n_frames(len(audio) / sr), stim["phonation"]) * keep
            floor, ceiling = self.pitch_range[stim["voice_gender"]]
            audio, _ = convert_parametric(
                audio,
                sr,
                cond,
                float(floor),
                float(ceiling),
                settings=self.settings,
                seed=int(_rng(request.seed, request.stimulus_id).integers(2**31)),
            )
        return S2SResponse(
            status="ok",
            transcript=text,
            audio=audio,
            sample_rate=sr,
            provenance={
                "model_revision": self.card.get("revision", ""),
                "output_voice": stim["voice_id"],
                "planted_retention": keep,
            },
        )
