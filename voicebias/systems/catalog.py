"""Every adapter of both kinds, for the command line (systems, preflight, serve) and the tests.

A stage imports its own kind's registry (voicebias.systems.s2s or .continuation) instead, so
that an edit to one adapter does not make every stage stale.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voicebias.config import CARDS_DIR
from voicebias.registry import Registry
from voicebias.systems.base import SystemUnderTest
from voicebias.systems.build import build_from
from voicebias.systems.continuation import CONTINUATION_ADAPTERS
from voicebias.systems.s2s import S2S_ADAPTERS

# Adapters named by a profile that this version does not ship yet: the preflight
# names them so a user sees what is missing instead of a traceback.
PLANNED_ADAPTERS: dict[str, str] = {}

ADAPTERS = Registry(
    "adapter",
    {name: reg.entry(name).target for reg in (S2S_ADAPTERS, CONTINUATION_ADAPTERS) for name in reg.names()},
    planned=PLANNED_ADAPTERS,
)


def adapter_class(adapter: str) -> type[SystemUnderTest]:
    """Import the class registered for `adapter` (only now: heavy backends load lazily)."""
    return ADAPTERS.get(adapter)


def build_system(name: str, params: dict[str, Any], cards_dir: Path = CARDS_DIR, **context: Any) -> SystemUnderTest:
    """The system `name` of either kind from its card and params (see voicebias.systems.build.build_from)."""
    return build_from(ADAPTERS, name, params, cards_dir, **context)
