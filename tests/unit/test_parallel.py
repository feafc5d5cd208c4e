"""Process-parallel work: results in input order whatever order the workers finish in,
one item's failure kept to that item, and a batched reference system answering exactly
as it does one request at a time."""

import os
import time

import numpy as np
import pytest

from voicebias.parallel import ItemFailed, ProcessBatched, map_processes


def slow_square(x: int) -> tuple[int, int]:
    time.sleep(0.02 * (5 - x % 5))  # later items finish first
    return x * x, os.getpid()


def test_results_come_back_in_input_order_from_several_processes():
    out = map_processes(slow_square, range(12), workers=2, size=lambda x: x)
    assert [v for v, _ in out] == [x * x for x in range(12)]
    assert len({pid for _, pid in out}) == 2 and os.getpid() not in {pid for _, pid in out}


def test_a_failing_item_is_returned_or_raised_without_losing_the_others():
    def fn(x):
        if x == 3:
            raise ValueError("three is bad")
        return x

    out = map_processes(fn, range(6), workers=2, failures="return")
    assert out[:3] == [0, 1, 2] and out[4:] == [4, 5]
    assert isinstance(out[3], ItemFailed) and out[3].error == "ValueError: three is bad"
    with pytest.raises(RuntimeError, match="1 of 6 items failed; first: ValueError: three is bad"):
        map_processes(fn, range(6), workers=2)


def test_one_worker_runs_in_this_process():
    assert map_processes(lambda x: os.getpid(), [1, 2, 3], workers=1) == [os.getpid()] * 3


class Base:
    def __init__(self):
        self.params = {}

    def close(self):
        self.closed = True


class Doubler(ProcessBatched, Base):
    def call(self, request):
        if request < 0:
            raise ValueError("negative")
        return np.full(3, 2.0 * request), os.getpid()


def test_process_batched_call_batch_answers_in_order_on_other_processes_and_closes():
    s = Doubler()
    got = s.call_batch(list(range(8)))
    assert [a.tolist() for a, _ in got] == [[2.0 * i] * 3 for i in range(8)]
    if os.cpu_count() and len(os.sched_getaffinity(0)) > 1:
        assert os.getpid() not in {pid for _, pid in got}
    with pytest.raises(RuntimeError, match="1 of 3 requests failed; first: ValueError: negative"):
        s.call_batch([1, -1, 2])
    s.close()
    assert s.closed and s._pool is None


class TwoWorkers(Doubler):
    def _workers(self):
        return 2

    def square(self, x):
        if x == 3:
            raise ValueError("three is bad")
        return x * x, os.getpid()


def test_map_method_runs_any_method_on_the_systems_pool_in_order():
    s = TwoWorkers()
    try:
        got = s.map_method("square", [0, 1, 2, 3, 4, 5])
        assert [g[0] for g in got[:3]] + [g[0] for g in got[4:]] == [0, 1, 4, 16, 25]
        assert isinstance(got[3], ItemFailed) and got[3].error == "ValueError: three is bad"
        assert os.getpid() not in {g[1] for g in got if not isinstance(g, ItemFailed)}
        pool = s._pool
        assert [a.tolist() for a, _ in s.call_batch([1, 2])] == [[2.0] * 3, [4.0] * 3] and s._pool is pool  # one pool
        assert s.map_method("square", [2]) == [(4, os.getpid())]  # one item: here, no worker needed
        assert s.map_method("square", []) == []
    finally:
        s.close()
    assert s._pool is None


class ChunkedWorkers(TwoWorkers):
    chunk_size = 3


def test_chunked_requests_go_to_one_worker_together_and_come_back_in_order():
    """`chunk_size` consecutive requests share a worker (work that worker keeps is reused); the
    answers are those of single requests, in input order."""
    s = ChunkedWorkers()
    try:
        got = s.map_method("square", [0, 1, 2, 4, 5, 6])
        assert [g[0] for g in got] == [0, 1, 4, 16, 25, 36]
        pids = [g[1] for g in got]
        assert pids[0] == pids[1] == pids[2] and pids[3] == pids[4] == pids[5]
    finally:
        s.close()


class Unpicklable(Exception):
    def __init__(self, message, handle):
        super().__init__(message)
        self.handle = handle

    def __reduce__(self):
        raise TypeError("cannot pickle this error")


def test_first_failure_raises_that_items_own_exception_as_a_serial_loop_would():
    from voicebias.audio import AudioError

    def fn(x):
        if x in (2, 4):
            raise AudioError(f"item {x} is silent", code="silent")
        return x

    for workers in (1, 2):
        with pytest.raises(AudioError, match="item 2 is silent") as err:
            map_processes(fn, range(6), workers=workers, size=lambda x: x, failures="first")
        assert err.value.code == "silent"
    assert map_processes(lambda x: x, range(6), workers=2, failures="first") == list(range(6))


def test_first_failure_that_cannot_travel_back_is_raised_with_its_message():
    def fn(x):
        if x == 1:
            raise Unpicklable("one is bad", lambda: None)
        return x

    with pytest.raises(RuntimeError, match="Unpicklable: one is bad"):
        map_processes(fn, range(4), workers=2, failures="first")


def test_meanwhile_runs_here_while_the_workers_work_and_its_errors_are_left_to_the_caller():
    ran = []

    def meanwhile():
        ran.append(os.getpid())
        raise ImportError("not yet")

    for workers in (1, 2):
        ran.clear()
        out = map_processes(slow_square, range(6), workers=workers, meanwhile=meanwhile)
        assert [v for v, _ in out] == [x * x for x in range(6)] and ran == [os.getpid()]


def _blas_threads(_: int) -> tuple[int, list[int]]:
    from threadpoolctl import threadpool_info

    return os.getpid(), [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_workers_run_one_blas_thread_each_and_leave_this_process_as_it_was():
    """One worker per core: each worker's BLAS pools (NumPy's and SciPy's OpenBLAS) have one
    thread, so two workers do not put four spinning BLAS threads on two cores."""
    from threadpoolctl import threadpool_info, threadpool_limits

    with threadpool_limits(limits=2, user_api="blas"):
        before = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
        out = map_processes(_blas_threads, list(range(8)), workers=2)
        after = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    assert before and all(n == 2 for n in before) and after == before
    assert {pid for pid, _ in out} - {os.getpid()}
    assert all(threads and set(threads) == {1} for _, threads in out)
