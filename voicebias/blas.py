"""One BLAS thread for the statistical fits.

The fits (REML, the binomial GLMM, beta and Firth regressions, the bootstrap) factorise many
matrices of a few hundred rows at most. OpenBLAS's threads only cost there: five SC
voice-quality designs took 11.8 s with two threads and 1.9 s with one on a 2-core machine, and
with the other core busy 17.7 s against 2.0 s. With one thread a fit's rounding also does not
depend on the machine's core count. Worker processes get one thread from their pool's
initializer (`voicebias.parallel.one_thread_per_worker`). See docs/reproducibility.md,
"Work on every core".
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

_STATE: dict[str, Any] = {"depth": 0}
_LOCK = threading.RLock()
_F = TypeVar("_F", bound=Callable[..., Any])


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block with one BLAS (and LAPACK) thread, then restore the process's setting.

    Nested blocks cost nothing; blocks in other threads of the process wait for each other,
    since the limit is the process's."""
    with _LOCK:
        if _STATE["depth"]:
            _STATE["depth"] += 1
            try:
                yield
            finally:
                _STATE["depth"] -= 1
            return
        if "controller" not in _STATE:
            from threadpoolctl import ThreadpoolController

            _STATE["controller"] = ThreadpoolController()  # the BLAS libraries loaded by now
        _STATE["depth"] = 1
        try:
            with _STATE["controller"].limit(limits=1, user_api="blas"):
                yield
        finally:
            _STATE["depth"] = 0


def single_blas_thread(fn: _F) -> _F:
    """Decorator: `fn` runs inside `one_blas_thread`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with one_blas_thread():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
