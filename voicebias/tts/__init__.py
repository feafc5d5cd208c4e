"""Text-to-speech backends behind one interface and a lazy registry.

A backend turns text into a mono float waveform for a named voice. Heavy backends
are imported only when selected, so the embedded default never imports them.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod

import numpy as np

# name -> "module:Class"; adapters for the paper profile are listed so the preflight
# can name them, and import only when used.
REGISTRY: dict[str, str] = {
    "espeak": "voicebias.tts.espeak:EspeakTTS",
    "kokoro": "voicebias.tts.kokoro:KokoroTTS",
    "azure": "voicebias.tts.azure:AzureTTS",
}

# Backends named by a profile that this version does not ship an adapter for yet.
PLANNED: dict[str, str] = {}


class TTSBackend(ABC):
    """Synthesises text with a named voice."""

    name: str = "tts"

    @abstractmethod
    def synthesize(self, text: str, voice: str) -> tuple[np.ndarray, int]:
        """Return (mono float32 waveform in [-1, 1], sample rate in Hz)."""

    def describe(self) -> dict[str, str]:
        """Provenance fields recorded in the stimulus manifest."""
        return {"backend": self.name}

    def voice_gender(self, voice: str) -> str | None:
        """The gender a voice is documented with ('male'/'female'), or None when the
        backend cannot tell; used to catch a female voice configured in a male slot."""
        return None


def get_backend(name: str, **options) -> TTSBackend:
    if name not in REGISTRY:
        if name in PLANNED:
            raise NotImplementedError(
                f"TTS backend '{name}' ({PLANNED[name]}) has no adapter in this version; "
                f"available: {', '.join(sorted(REGISTRY))}"
            )
        raise KeyError(f"unknown TTS backend '{name}'; available: {', '.join(sorted(REGISTRY))}")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module), cls)(**options)
