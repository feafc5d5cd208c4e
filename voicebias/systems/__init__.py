"""Systems under test: adapters behind two string-keyed registries with lazy "module:Class" imports.

The speech-to-speech adapters are registered in voicebias.systems.s2s, the speech-continuation
adapters in voicebias.systems.continuation, both together in voicebias.systems.catalog (what the
command line lists); a stage imports only its own registry, so editing one kind's adapter does not
make the other kind's stages stale. Adding a system is one adapter file, one registry line and one
card under models/cards/ (voicebias.cards; docs/extending/system.md).

The table of adapters and what each runs: docs/systems.md, "Adapters".
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
