"""The speech-continuation adapters: name -> "module:Class", imported only when a system needs it.

The sc_continue stage builds its systems from this registry alone (voicebias.systems.build).
"""

from __future__ import annotations

from voicebias.registry import Registry

CONTINUATION_ADAPTERS = Registry(
    "continuation adapter",
    {
        "reference_continuation": "voicebias.systems.reference_continuation:ReferenceContinuationSystem",
        "spiritlm": "voicebias.systems.spiritlm:SpiritLMSystem",
        "speechgpt": "voicebias.systems.speechgpt:SpeechGPTSystem",
        "vae_gslm": "voicebias.systems.vae_gslm:VAEGSLMSystem",
    },
)
