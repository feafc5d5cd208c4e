"""Systems under test: a string-keyed registry with lazy "module:Class" imports.

Adding a system is one adapter file plus one card under models/cards/. A card
records what the audit needs to name the system exactly: `adapter`, `checkpoint`,
`revision`, `output_voice` (per language), `licence` and `memory`, plus optional
`requires` (env / gpu / checkout / weights) read by the preflight.

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
step_audio2               their repository, in its own environment (subprocess)
spiritlm, speechgpt,      speech-continuation models, same route
vae_gslm
========================  =========================================================
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import yaml

from voicebias.config import CARDS_DIR
from voicebias.exceptions import ConfigError, NotAvailable, NotFound
from voicebias.registry import Registry
from voicebias.systems.base import (
    ContinuationRequest, ContinuationSystem, S2SRequest, S2SResponse, S2SSystem, SetupError, SystemUnderTest,
    TransientError,
)

# Adapters named by a profile that this version does not ship yet: the preflight
# names them so a user sees what is missing instead of a traceback.
PLANNED_ADAPTERS: dict[str, str] = {}

ADAPTERS = Registry("adapter", {
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
}, planned=PLANNED_ADAPTERS)

CARD_KEYS = ("adapter", "checkpoint", "revision", "output_voice", "licence", "memory")

__all__ = ["ADAPTERS", "PLANNED_ADAPTERS", "CARD_KEYS", "ContinuationRequest", "ContinuationSystem", "S2SRequest",
           "S2SResponse", "S2SSystem", "SetupError", "SystemUnderTest", "TransientError", "load_card", "build_system",
           "adapter_class"]


def load_card(name: str, cards_dir: Path = CARDS_DIR) -> dict[str, Any]:
    """Read models/cards/<name>.yaml and check it names the system completely."""
    path = Path(cards_dir) / f"{name}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"no system card for '{name}' (expected {path})")
    with open(path, encoding="utf-8") as fh:
        card = yaml.safe_load(fh)
    if not isinstance(card, dict):
        raise ConfigError(f"system card {path} does not hold a mapping")
    for key in CARD_KEYS:
        if key not in card:
            raise ConfigError(f"system card {path} lacks '{key}'")
    return card


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
