"""The project's exception hierarchy: every error raised on purpose is a VoicebiasError.

This module imports nothing from the project, so any module can subclass these
without an import cycle; `voicebias.errors` re-exports them next to `guarded`, which
turns them into one readable line. Each concrete class also keeps the builtin base
its callers catch (ValueError, RuntimeError, KeyError, NotImplementedError,
FileNotFoundError).
"""

from __future__ import annotations


class VoicebiasError(Exception):
    """An expected failure with a message meant for the user (printed by `guarded`)."""


class ConfigError(VoicebiasError, ValueError):
    """A setting, argument or input table the project cannot use; the message says which."""


class StageFailed(VoicebiasError, RuntimeError):
    """A stage ran and its outcome is a failure; the message names the reason."""


class NotAvailable(VoicebiasError, NotImplementedError):
    """A component the profile names that this version does not ship."""


class NotFound(VoicebiasError, KeyError):
    """A named setting, column, voice or component that is not there.

    Unlike a plain KeyError, str() is the message itself (not its repr).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
