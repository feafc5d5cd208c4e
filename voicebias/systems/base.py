"""The model contract: a speech-to-speech system takes audio plus a native-language
prompt and returns output audio plus its own transcript.

A failed call is returned as a response with status 'failed' and the reason; it is
never replaced by an invented output.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class TransientError(RuntimeError):
    """A failure worth retrying (rate limit, 5xx, timeout)."""


@dataclass(frozen=True)
class S2SRequest:
    stimulus_id: str
    lang: str            # source language of the audio
    target_lang: str     # language the answer should be in
    task: str
    prompt: str
    audio_path: str
    audio_sha256: str
    seed: int


@dataclass
class S2SResponse:
    status: str                      # 'ok' or 'failed'
    transcript: str | None = None
    audio: np.ndarray | None = None
    sample_rate: int | None = None
    error: str = ""
    provenance: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failed(cls, reason: str, **provenance: Any) -> "S2SResponse":
        return cls(status="failed", error=reason, provenance=dict(provenance))


class S2SSystem(ABC):
    """One system under test. Subclasses implement `respond`."""

    #: bounded concurrency for API systems; local systems batch instead
    max_concurrency: int = 1

    def __init__(self, name: str, card: dict[str, Any], params: dict[str, Any]):
        self.name = name
        self.card = card
        self.params = params

    @abstractmethod
    def respond(self, request: S2SRequest) -> S2SResponse:
        """Run one request; raise TransientError for retryable failures."""

    def generation_settings(self) -> dict[str, Any]:
        """Everything besides the request that changes the output (part of the cache key)."""
        return dict(self.params)
