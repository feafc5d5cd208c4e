"""One readable line (or block) for every expected failure, instead of a traceback."""

from __future__ import annotations

import sys
from typing import Any, Callable

from voicebias.audio import AudioError
from voicebias.validation import ValidationFailed

EXPECTED = (ValidationFailed, FileNotFoundError, KeyError, ValueError, NotImplementedError, AudioError, RuntimeError)


def guarded(fn: Callable[..., Any], *args: Any, stage: str = "", **kwargs: Any) -> Any:
    """Call fn; on an expected failure print 'voicebias <stage>: <message>' and exit 1."""
    try:
        return fn(*args, **kwargs)
    except EXPECTED as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        print(f"voicebias {stage}: {msg}".rstrip(), file=sys.stderr)
        sys.exit(1)


def stage_params(stage: str) -> dict[str, Any]:
    """params.yaml validated for a stage; a schema problem prints its key paths and exits 1."""
    from voicebias.config import load_params

    return guarded(load_params, stage=stage)
