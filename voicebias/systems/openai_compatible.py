"""Any system served behind an OpenAI-compatible audio chat endpoint that answers in speech.

Same call as voicebias.systems.openai_audio, sent to `base_url` from the system's params or card,
or shared across several servers named by `endpoints` (voicebias.clients.endpoints). The server
must return audio (plain vLLM answers in text only; vLLM-Omni speaks); a reply without audio is a
recorded failure. `base_url` (or `endpoints`) is required and a key optional ('EMPTY' is sent
without one).

See docs/systems.md, "Any OpenAI-compatible server".
"""

from __future__ import annotations

from pathlib import Path

from voicebias.errors import SetupError
from voicebias.secrets import require_secret
from voicebias.systems.openai_audio import OpenAIAudioSystem

NO_KEY = "EMPTY"  # placeholder for servers that take no key; not a secret


class OpenAICompatibleSystem(OpenAIAudioSystem):
    """A speech-to-speech system behind an OpenAI-compatible endpoint at `base_url`."""

    max_concurrency = 8
    default_key_env = None

    def _check_endpoints(self) -> None:
        if self.endpoints_source == "default":
            raise ValueError(
                f"system '{self.name}' (openai_compatible) needs 'base_url' or 'endpoints' in its "
                "params or card, e.g. base_url: http://gpu-box:8000/v1"
            )

    def _api_key(self, root: Path | None) -> str:
        var = self.params.get("api_key_env") or self.card.get("api_key_env")
        self._key_var = var
        return require_secret(f"system '{self.name}'", var, root, error=SetupError) if var else NO_KEY
