"""One readable line (or block) for every expected failure, instead of a traceback.

Expected failures are the project's own errors (`VoicebiasError` and its subclasses,
voicebias.exceptions) and missing files. Anything else, a KeyError from a bug say,
propagates with its traceback. VOICEBIAS_DEBUG=1 prints the traceback of expected
failures too.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any, Callable

from voicebias.exceptions import ConfigError, NotAvailable, StageFailed, VoicebiasError

__all__ = ["EXPECTED", "ConfigError", "NotAvailable", "StageFailed", "VoicebiasError", "guarded", "stage_params"]

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


def stage_params(stage: str) -> dict[str, Any]:
    """params.yaml validated for a stage; a schema problem prints its key paths and exits 1."""
    from voicebias.params import load_params

    return guarded(load_params, stage=stage)
