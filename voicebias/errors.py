"""The project's errors: every error raised on purpose is a VoicebiasError, and `guarded` turns
one into a single readable line instead of a traceback.

This module imports nothing from the project at load time, so any module can raise or subclass
these without an import cycle. Each concrete class also keeps the builtin base its callers
catch (ValueError, RuntimeError, KeyError, NotImplementedError). Expected failures are these
errors and missing files; anything else, a KeyError from a bug say, propagates with its
traceback. VOICEBIAS_DEBUG=1 prints the traceback of expected failures too.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, Callable


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


class TransientError(VoicebiasError, RuntimeError):
    """A failure worth retrying (rate limit, 5xx, timeout).

    `retry_after_s` carries a server's Retry-After hint, when it sent one.
    """

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SetupError(VoicebiasError, RuntimeError):
    """A component (a system, the ASR, a judge, a converter) cannot run on this machine as
    configured; the message says what is missing."""


EXPECTED = (VoicebiasError, FileNotFoundError)


def guarded(fn: Callable[..., Any], *args: Any, stage: str = "", **kwargs: Any) -> Any:
    """Call fn; on an expected failure print 'voicebias <stage>: <message>' and exit 1."""
    try:
        return fn(*args, **kwargs)
    except EXPECTED as exc:
        if os.environ.get("VOICEBIAS_DEBUG") == "1":
            traceback.print_exc(file=sys.stderr)
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        print(f"voicebias {stage}: {msg}".rstrip(), file=sys.stderr)
        sys.exit(1)
