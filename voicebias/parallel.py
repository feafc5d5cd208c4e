"""Independent CPU work on every core, in input order.

`map_processes(fn, items)` runs `fn` on each item in forked worker processes and returns the
results in the order of `items`, the largest items first when `size` says how large each is; a
failed item is returned as an `ItemFailed` or raised, as `failures` says. `ProcessBatched` gives a
locally computed system a `call_batch` that answers a batch on every core, byte-identical on any
number of cores. Every worker starts with one BLAS thread (`one_thread_per_worker`).

The failure modes and why one BLAS thread: docs/reproducibility.md, "Work on every core".
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from voicebias.errors import VoicebiasError

_STATE: dict[int, Any] = {}


@dataclass
class ItemFailed:
    """What `fn` raised for one item: the exception's type name and message, and the
    exception itself with its traceback where it could be carried back from a worker."""

    error: str
    exception: BaseException | None = field(default=None, compare=False, repr=False)
    traceback: str = field(default="", compare=False, repr=False)


class RemoteTraceback(VoicebiasError):
    """The traceback of an exception raised in a worker process (set as its cause)."""

    def __str__(self) -> str:
        return self.args[0] if self.args else ""


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def one_thread_per_worker() -> None:
    """Limit this process's BLAS (and LAPACK) thread pools to one thread: the
    initializer of every worker pool, where the cores are already shared out one per
    worker. (PyTorch's threads are set where a model runs; the tests check that results
    from workers equal those of one process.)"""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


def _run(job: tuple[int, int, Any]) -> Any:
    token, _, item = job
    fn = _STATE[token]
    try:
        return fn(item)
    except Exception as exc:  # one item's failure is that item's result
        try:
            pickle.loads(pickle.dumps(exc))
            carried = exc
        except Exception:  # an exception that does not survive pickling: its message only
            carried = None
        return ItemFailed(f"{type(exc).__name__}: {exc}", carried, traceback.format_exc())


def _run_method(job: tuple[int, str, Any]) -> Any:
    token, name, item = job
    try:
        return getattr(_STATE[token], name)(item)
    except Exception as exc:  # one item's failure is that item's result
        return ItemFailed(f"{type(exc).__name__}: {exc}")


def _head_start(meanwhile: Callable[[], Any] | None) -> None:
    if meanwhile is not None:
        try:
            meanwhile()
        except Exception:  # the caller's own later call raises it where it belongs
            pass


def map_processes(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    workers: int | None = None,
    size: Callable[[Any], float] | None = None,
    desc: str | None = None,
    failures: str = "raise",
    meanwhile: Callable[[], Any] | None = None,
) -> list[Any]:
    """[fn(item) for item in items], computed on `workers` forked processes (default:
    every core); see the module docstring. One worker (or fewer than two items) runs in
    this process. `failures`: "raise", "return" or "first".

    `meanwhile`, when given, is called in this process once the workers are started, so
    work the caller needs next (an import, say) overlaps theirs; with one worker it is
    called after the items. What it raises is ignored: it is only a head start on a call
    the caller makes again itself."""
    from tqdm import tqdm

    items = list(items)
    workers = min(workers or cores(), len(items))
    token = id(fn)
    _STATE[token] = fn
    try:
        if workers <= 1:
            results = [_run((token, i, it)) for i, it in enumerate(tqdm(items, desc=desc, disable=desc is None))]
            _head_start(meanwhile)
        else:
            order = sorted(range(len(items)), key=lambda i: -size(items[i])) if size else list(range(len(items)))
            ctx = multiprocessing.get_context("fork")
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=one_thread_per_worker) as pool:
                running = pool.map(_run, [(token, i, items[i]) for i in order], chunksize=1)  # forks the workers
                _head_start(meanwhile)
                done = list(tqdm(running, total=len(items), desc=desc, disable=desc is None))
            results = [None] * len(items)
            for i, r in zip(order, done):
                results[i] = r
    finally:
        _STATE.pop(token, None)
    bad = [r for r in results if isinstance(r, ItemFailed)]
    if bad and failures == "raise":
        raise RuntimeError(f"{len(bad)} of {len(items)} items failed; first: {bad[0].error}")
    if bad and failures == "first":
        first = bad[0]
        if first.exception is None:
            raise RuntimeError(first.error)
        raise first.exception from RemoteTraceback(first.traceback)
    return results


class ProcessBatched:
    """Mixin for a system computed locally on the CPU: `call_batch` answers the batch's
    requests on every core, in order, from one pool of forked workers created at the first batch and closed with
    the system. A request whose call raises fails the batch as the runner expects
    (it then retries the items one by one)."""

    #: requests per batch: enough to keep every worker busy
    batch_size: int = 32
    #: consecutive requests a worker takes at once: requests that share work a worker keeps
    #: (a synthesiser's last utterances) go to the same worker
    chunk_size: int = 1
    _pool: ProcessPoolExecutor | None = None

    def _workers(self) -> int:
        return cores()

    def map_method(self, name: str, items: Sequence[Any]) -> list[Any]:
        """[getattr(self, name)(item) for item in items], in order, on the system's pool (in this
        process for fewer than two items or one core); an item whose call raises is returned
        as an `ItemFailed`. The workers are forked when the pool is first needed, so they
        see the system as it was then."""
        if len(items) < 2 or self._workers() == 1:
            return self._here(name, items)
        if self._pool is None:
            _STATE[id(self)] = self
            self._pool = ProcessPoolExecutor(
                max_workers=self._workers(),
                initializer=one_thread_per_worker,
                mp_context=multiprocessing.get_context("fork"),
            )
        return list(self._pool.map(_run_method, [(id(self), name, it) for it in items], chunksize=self.chunk_size))

    def _here(self, name: str, items: Sequence[Any]) -> list[Any]:
        out = []
        for it in items:
            try:
                out.append(getattr(self, name)(it))
            except Exception as exc:
                out.append(ItemFailed(f"{type(exc).__name__}: {exc}"))
        return out

    def call_batch(self, requests: Sequence[Any]) -> list[Any]:
        if len(requests) < 2 or self._workers() == 1:
            return [self.call(r) for r in requests]
        results = self.map_method("call", requests)
        bad = [r for r in results if isinstance(r, ItemFailed)]
        if bad:
            raise RuntimeError(f"{len(bad)} of {len(requests)} requests failed; first: {bad[0].error}")
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
            _STATE.pop(id(self), None)
        super().close()
