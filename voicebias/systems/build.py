"""Build a system under test from its card, its params and the registry of the stage's kind."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from voicebias.cards import load_card
from voicebias.config import CARDS_DIR
from voicebias.errors import ConfigError, NotAvailable
from voicebias.registry import Registry
from voicebias.systems.base import SystemUnderTest


def build_from(
    adapters: Registry, name: str, params: dict[str, Any], cards_dir: Path = CARDS_DIR, **context: Any
) -> SystemUnderTest:
    """The system `name` from its card and params, its adapter looked up in `adapters`.

    A card whose adapter is not in `adapters` (a speech-to-speech system given to the
    continuation stage, say, or a misspelt adapter) is a ConfigError naming the adapters the
    registry has. `context` (stimulus table, passages, repository root, ...) is handed to the
    adapter's constructor where it declares the argument; adapters ignore the rest.
    """
    from voicebias.params import validate_system

    card = load_card(name, cards_dir)
    adapter = card["adapter"]
    if adapter not in adapters and adapter not in adapters.planned:
        raise ConfigError(
            f"system '{name}' has adapter '{adapter}', which is not a {adapters.kind}; "
            f"this stage takes {', '.join(adapters.names())}"
        )
    params = validate_system(name, adapter, params)
    try:
        cls = adapters.get(adapter)
    except NotImplementedError as exc:
        raise NotAvailable(f"system '{name}' cannot run: {exc}") from None
    sig = inspect.signature(cls.__init__)
    if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        context = {k: v for k, v in context.items() if k in sig.parameters}
    return cls(name, card, params, **context)
