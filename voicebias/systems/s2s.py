"""The speech-to-speech adapters: name -> "module:Class", imported only when a system needs it.

The respond stage builds its systems from this registry alone (voicebias.systems.build), so
its code deps are these adapters and not the continuation ones.
"""

from __future__ import annotations

from voicebias.registry import Registry

S2S_ADAPTERS = Registry(
    "speech-to-speech adapter",
    {
        "reference": "voicebias.systems.reference:ReferenceSystem",
        "openai_audio": "voicebias.systems.openai_audio:OpenAIAudioSystem",
        "openai_compatible": "voicebias.systems.openai_compatible:OpenAICompatibleSystem",
        "vllm_omni": "voicebias.systems.vllm_omni:VLLMOmniSystem",
        "gemini_live": "voicebias.systems.gemini_live:GeminiLiveSystem",
        "qwen_omni": "voicebias.systems.qwen_omni:QwenOmniSystem",
        "kimi_audio": "voicebias.systems.kimi_audio:KimiAudioSystem",
        "glm4_voice": "voicebias.systems.glm4_voice:GLM4VoiceSystem",
        "step_audio2": "voicebias.systems.step_audio2:StepAudio2System",
    },
)
