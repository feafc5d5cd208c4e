"""Named, lazily imported components: TTS backends, classifiers, embedders, systems, judges, converters.

A `Registry` maps a name to a "module:attribute" string (a class or a function) and
imports the module only when `get(name)` first asks for it, so the embedded default
never imports a heavy backend it does not use. Each entry may carry metadata (the
published checkpoint behind a name, say). An unknown name raises `UnknownName`, which
lists the choices; a name the registry knows as planned (named by a profile, not
shipped in this version) raises `NotAvailable`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from voicebias.errors import NotAvailable, NotFound


class UnknownName(NotFound):
    """A name no registry entry has; the message lists the registered names, sorted."""

    def __init__(self, kind: str, name: str, choices: list[str]):
        super().__init__(f"unknown {kind} '{name}'; available: {', '.join(sorted(choices))}")
        self.kind, self.name, self.choices = kind, name, sorted(choices)


@dataclass(frozen=True)
class Entry:
    name: str
    target: str  # "module:attribute"
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def attribute(self) -> str:
        return self.target.partition(":")[2]


class Registry:
    """Names -> lazily imported objects ("module:attribute"), with optional metadata per name.

    `kind` names what the registry holds in its error messages ("TTS backend").
    `entries` maps a name to its target string, or to (target, metadata mapping).
    `planned` maps names a profile may use but this version does not ship to a note.
    """

    def __init__(
        self,
        kind: str,
        entries: Mapping[str, str | tuple[str, Mapping[str, Any]]] | None = None,
        planned: Mapping[str, str] | None = None,
    ):
        self.kind = kind
        self._entries: dict[str, Entry] = {}
        self._loaded: dict[str, Any] = {}
        self.planned: dict[str, str] = dict(planned or {})
        for name, spec in (entries or {}).items():
            target, meta = (spec, {}) if isinstance(spec, str) else spec
            self.register(name, target, **meta)

    def register(self, name: str, target: str, **meta: Any) -> None:
        module, sep, attribute = target.partition(":")
        if not (module and sep and attribute):
            raise ValueError(f"{self.kind} '{name}': target must read 'module:attribute', not '{target}'")
        self._entries[name] = Entry(name, target, dict(meta))
        self._loaded.pop(name, None)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, name: str) -> Entry:
        """The entry of `name`; raises NotAvailable for a planned name, UnknownName otherwise."""
        try:
            return self._entries[name]
        except KeyError:
            pass
        if name in self.planned:
            raise NotAvailable(
                f"{self.kind} '{name}' ({self.planned[name]}) is not shipped in this version; "
                f"available: {', '.join(self.names())}"
            ) from None
        raise UnknownName(self.kind, name, self.names()) from None

    def meta(self, name: str) -> Mapping[str, Any]:
        """The metadata registered with `name` (empty when none)."""
        return self.entry(name).meta

    def get(self, name: str) -> Any:
        """The class or function registered as `name`, imported on first use."""
        e = self.entry(name)
        if name not in self._loaded:
            self._loaded[name] = getattr(importlib.import_module(e.module), e.attribute)
        return self._loaded[name]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
