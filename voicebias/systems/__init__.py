"""Systems under test: a string-keyed registry with lazy "module:Class" imports.

Adding a system is one adapter file plus one card under models/cards/. A card
records what the audit needs to name the system exactly: `adapter`, `checkpoint`,
`revision`, `output_voice` (per language), `licence` and `memory`, plus optional
`requires` (env / gpu / checkout / weights) read by the preflight, and an optional
`weights` list of the Hugging Face hub repositories `voicebias fetch` downloads
(see :func:`validate_weights`).

Adapters:

========================  =========================================================
reference                 planted-truth systems of the embedded default
reference_continuation    planted-truth speech-continuation system (embedded default)
openai_audio              OpenAI audio chat completions (gpt-4o-audio / gpt-audio)
openai_compatible         any OpenAI-compatible audio endpoint (e.g. vLLM), base_url
vllm_omni                 models served by vLLM-Omni (audio_url in, per-stage sampling)
gemini_live               Gemini Live native audio (google-genai, voice Kore)
qwen_omni                 Qwen2.5-Omni through transformers (local weights)
kimi_audio, glm4_voice,   speech-to-speech models run from the user's checkout of
step_audio2               their repository, in its own environment (subprocess), or
                          over HTTP from the shims `voicebias serve` starts
spiritlm, speechgpt,      speech-continuation models, same routes
vae_gslm
========================  =========================================================
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from voicebias.cards import CARD_KEYS, WEIGHT_KEYS, load_card, validate_weights
from voicebias.config import CARDS_DIR
from voicebias.errors import NotAvailable, NotFound, SetupError, TransientError
from voicebias.registry import Registry
from voicebias.systems.base import (
    ContinuationRequest,
    ContinuationSystem,
    S2SRequest,
    S2SResponse,
    S2SSystem,
    SystemUnderTest,
)

# Adapters named by a profile that this version does not ship yet: the preflight
# names them so a user sees what is missing instead of a traceback.
PLANNED_ADAPTERS: dict[str, str] = {}

ADAPTERS = Registry(
    "adapter",
    {
        "reference": "voicebias.systems.reference:ReferenceSystem",
        "reference_continuation": "voicebias.systems.reference_continuation:ReferenceContinuationSystem",
        "openai_audio": "voicebias.systems.openai_audio:OpenAIAudioSystem",
        "openai_compatible": "voicebias.systems.openai_compatible:OpenAICompatibleSystem",
        "vllm_omni": "voicebias.systems.vllm_omni:VLLMOmniSystem",
        "gemini_live": "voicebias.systems.gemini_live:GeminiLiveSystem",
        "qwen_omni": "voicebias.systems.qwen_omni:QwenOmniSystem",
        "kimi_audio": "voicebias.systems.kimi_audio:KimiAudioSystem",
        "glm4_voice": "voicebias.systems.glm4_voice:GLM4VoiceSystem",
        "step_audio2": "voicebias.systems.step_audio2:StepAudio2System",
        "spiritlm": "voicebias.systems.spiritlm:SpiritLMSystem",
        "speechgpt": "voicebias.systems.speechgpt:SpeechGPTSystem",
        "vae_gslm": "voicebias.systems.vae_gslm:VAEGSLMSystem",
    },
    planned=PLANNED_ADAPTERS,
)

__all__ = [
    "ADAPTERS",
    "PLANNED_ADAPTERS",
    "CARD_KEYS",
    "ContinuationRequest",
    "ContinuationSystem",
    "S2SRequest",
    "S2SResponse",
    "S2SSystem",
    "SetupError",
    "SystemUnderTest",
    "TransientError",
    "load_card",
    "build_system",
    "adapter_class",
    "validate_weights",
    "WEIGHT_KEYS",
]


def adapter_class(adapter: str) -> type[SystemUnderTest]:
    """Import the class registered for `adapter` (only now: heavy backends load lazily)."""
    return ADAPTERS.get(adapter)


def build_system(name: str, params: dict[str, Any], cards_dir: Path = CARDS_DIR, **context: Any) -> SystemUnderTest:
    """The system `name` from its card and params.

    `context` (stimulus table, passages, repository root, ...) is handed to the
    adapter's constructor where it declares the argument; adapters ignore the rest.
    """
    from voicebias.params import validate_system

    card = load_card(name, cards_dir)
    params = validate_system(name, card["adapter"], params)
    try:
        cls = adapter_class(card["adapter"])
    except NotImplementedError as exc:
        raise NotAvailable(f"system '{name}' cannot run: {exc}") from None
    except KeyError as exc:
        raise NotFound(f"system '{name}': {exc.args[0]}") from None
    sig = inspect.signature(cls.__init__)
    if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        context = {k: v for k, v in context.items() if k in sig.parameters}
    return cls(name, card, params, **context)
