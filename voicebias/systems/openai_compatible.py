"""Any system served behind an OpenAI-compatible audio chat endpoint that answers in speech.

Same call as :mod:`voicebias.systems.openai_audio` (modalities text + audio, a
fixed voice, input_audio as base64 WAV), sent to `base_url` from the system's
params or card, or shared across several servers of the same model named by
`endpoints: [{url, weight, max_concurrency}, ...]` (params, card, or the untracked
endpoints file; see :mod:`voicebias.clients.endpoints`). This is how an audit scales
past one GPU box: point it at the serving infrastructure that already hosts the
model, and raise `max_concurrency` or add endpoints.

The server must return audio in the reply. Plain vLLM takes audio input but its
chat endpoint answers in text only; speech output needs a server built for it,
such as vLLM-Omni (`vllm serve <model> --omni`, e.g. Qwen2.5-Omni). A text-only
server's replies carry no audio and are recorded as failures.

Differences from the OpenAI adapter: `base_url` (or `endpoints`) is required; a key is optional
(`api_key_env` names the variable; without one the conventional placeholder
'EMPTY' is sent, as local vLLM servers accept); a reply without a transcript is
accepted with none (the runner transcribes it when the system's params name an
`asr` model); server-specific sampling options go in `extra_body`.
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
