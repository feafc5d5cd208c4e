"""Text-to-speech backends behind one interface and a lazy registry.

A backend turns text into a mono float waveform for a named voice. Heavy backends
are imported only when selected, so the embedded default never imports them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from voicebias.registry import Registry

# name -> "module:Class"; adapters for the paper profile are listed so the preflight
# can name them, and import only when used.
# PLANNED: backends named by a profile that this version does not ship an adapter for yet.
PLANNED: dict[str, str] = {}
REGISTRY = Registry(
    "TTS backend",
    {
        "espeak": "voicebias.tts.espeak:EspeakTTS",
        "kokoro": "voicebias.tts.kokoro:KokoroTTS",
        "azure": "voicebias.tts.azure:AzureTTS",
    },
    planned=PLANNED,
)


class TTSBackend(ABC):
    """Synthesises text with a named voice."""

    name: str = "tts"
    #: True when synthesis may run in forked worker processes, one utterance each, with
    #: the same output as in this process (a local CPU backend whose output depends on
    #: the text and voice alone); the stimulus stages then voice on every core
    processes: bool = False

    @abstractmethod
    def synthesize(self, text: str, voice: str) -> tuple[np.ndarray, int]:
        """Return (mono float32 waveform in [-1, 1], sample rate in Hz)."""

    def describe(self) -> dict[str, str]:
        """Provenance fields recorded in the stimulus manifest."""
        return {"backend": self.name}

    def cache_identity(self) -> dict[str, str] | None:
        """What, besides the text and voice, decides this backend's samples (engine and its
        version, settings, the code that calls it), for voicebias.tts.render_cache; None
        when the backend cannot say (its renders are then never cached)."""
        return None

    def voice_gender(self, voice: str) -> str | None:
        """The gender a voice is documented with ('male'/'female'), or None when the
        backend cannot tell; used to catch a female voice configured in a male slot."""
        return None


def get_backend(name: str, **options) -> TTSBackend:
    """Instantiate a registered backend (imported now); options go to its constructor."""
    return REGISTRY.get(name)(**options)
