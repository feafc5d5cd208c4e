"""Systems under test: adapters behind two string-keyed registries with lazy "module:Class" imports.

The speech-to-speech adapters are registered in voicebias.systems.s2s, the speech-continuation
adapters in voicebias.systems.continuation, both together in voicebias.systems.catalog (what the
command line lists); a stage imports only its own registry, so editing one kind's adapter does
not make the other kind's stages stale. Adding a system is one adapter file, one registry line
and one card under models/cards/ (voicebias.cards; docs/extending/system.md).

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

from voicebias.errors import SetupError, TransientError
from voicebias.systems.base import (
    ContinuationRequest,
    ContinuationSystem,
    S2SRequest,
    S2SResponse,
    S2SSystem,
    SystemUnderTest,
)

__all__ = [
    "ContinuationRequest",
    "ContinuationSystem",
    "S2SRequest",
    "S2SResponse",
    "S2SSystem",
    "SetupError",
    "SystemUnderTest",
    "TransientError",
]
