"""The endpoint pool: weighted picks, a bound per endpoint, fail-over with a cool-down, a circuit
breaker per endpoint, a clear error when every endpoint is down, and where an endpoint list is read from.

What users rely on: a request is at one endpoint at a time and never sent again once
answered; an endpoint never holds more than its max_concurrency; an unreachable one is
skipped until its cool-down ends; an endpoint that keeps failing gets nothing while its
breaker is open, then exactly one probe, and after a set number of failed probes nothing
at all; the endpoints file overrides params and card.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest

from voicebias.clients.endpoints import (
    PROBE_POLL_S,
    AllEndpointsDown,
    Breaker,
    CircuitOpen,
    Endpoint,
    EndpointPool,
    Unreachable,
    endpoints_file,
    parse_endpoints,
    resolve_endpoints,
)
from voicebias.errors import ConfigError


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def pool_of(*specs, **kw):
    eps = [Endpoint(f"http://h{i}:8000/v1", weight=w, max_concurrency=c) for i, (w, c) in enumerate(specs)]
    return EndpointPool(eps, name="t", report=lambda line: None, **kw)


def test_picks_follow_the_weights_when_there_is_spare_capacity():
    pool = pool_of((3, 4), (2, 4), (1, 4))
    picks = Counter(pool.call(lambda i: i)[0] for _ in range(600))
    assert picks == {0: 300, 1: 200, 2: 100}  # smooth weighted round-robin: exact over whole cycles
    # and interleaved, not in runs: each cycle of six picks holds every endpoint its share
    seq = [pool.call(lambda i: i)[0] for _ in range(12)]
    for k in range(0, 12, 6):
        assert Counter(seq[k : k + 6]) == {0: 3, 1: 2, 2: 1}


def test_no_endpoint_exceeds_its_max_concurrency_and_the_pool_fills_them_all():
    pool = pool_of((1, 2), (5, 1), (1, 3))
    assert pool.capacity == 6
    lock = threading.Lock()
    now = Counter()
    peak = Counter()

    def once(i):
        with lock:
            now[i] += 1
            peak[i] = max(peak[i], now[i])
        time.sleep(0.02)
        with lock:
            now[i] -= 1
        return i

    threads = [threading.Thread(target=lambda: [pool.call(once) for _ in range(10)]) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] <= 2 and peak[1] <= 1 and peak[2] <= 3
    stats = pool.stats()
    assert sum(s["answered"] for s in stats) == 80 and all(s["answered"] > 0 for s in stats)
    assert [s["max_in_flight"] for s in stats] == [peak[0], peak[1], peak[2]]


def test_an_unreachable_endpoint_is_skipped_for_its_cool_down_then_tried_again():
    clock = Clock()
    pool = pool_of((1, 4), (1, 4), cooldown_s=2.0, clock=clock)
    dead = {0}
    calls = []

    def once(i):
        calls.append(i)
        if i in dead:
            raise Unreachable("connection error: refused")
        return f"answer from {i}"

    # the first pick goes to endpoint 0, which is down: the request moves to 1 within the same call
    assert pool.call(once) == (1, "answer from 1") and calls == [0, 1]
    calls.clear()
    for _ in range(5):
        assert pool.call(once)[0] == 1
    assert calls == [1] * 5  # endpoint 0 is left alone while it cools down
    clock.t += 2.01
    calls.clear()
    dead.clear()
    picks = [pool.call(once)[0] for _ in range(4)]
    assert 0 in picks and calls == picks  # back after the cool-down, and every request sent once
    s0 = pool.stats()[0]
    assert s0["unreachable"] == 1 and s0["sent"] == s0["answered"] + s0["unreachable"]


def test_cool_down_doubles_while_an_endpoint_stays_down_and_resets_when_it_answers():
    clock = Clock()
    pool = pool_of((1, 1), (1, 1), cooldown_s=1.0, max_cooldown_s=3.0, clock=clock)
    dead = {0}

    def once(i):
        if i in dead:
            raise Unreachable("timeout after 5 s")
        return i

    def fail_again():
        """Once endpoint 0's cool-down is over, call until it is tried (and fails); its new cool-down."""
        clock.t = pool._state[0].down_until + 0.001
        start, n = clock.t, pool.stats()[0]["unreachable"]
        while pool.stats()[0]["unreachable"] == n:
            assert pool.call(once)[0] == 1
        return round(pool._state[0].down_until - start, 3)

    assert pool.call(once) == (1, 1) and pool._state[0].down_until == pytest.approx(clock.t + 1.0)
    assert [fail_again() for _ in range(3)] == [2.0, 3.0, 3.0]  # doubled, capped at 3 s
    dead.clear()
    clock.t = pool._state[0].down_until + 0.001
    while pool.call(once)[0] != 0:
        pass
    assert pool._state[0].failures_in_row == 0 and pool._state[0].down_until == 0.0


def test_every_endpoint_down_fails_the_call_with_a_clear_error_and_a_retry_hint():
    clock = Clock()
    pool = pool_of((1, 2), (1, 2), (1, 2), cooldown_s=5.0, clock=clock)
    calls = []

    def once(i):
        calls.append(i)
        raise Unreachable("connection error: Connection error.")

    with pytest.raises(AllEndpointsDown, match=r"every endpoint is down \(3 endpoints, 3 tried") as info:
        pool.call(once)
    assert sorted(calls) == [0, 1, 2]  # each tried once, one after the other
    assert info.value.retry_after_s == pytest.approx(5.0)
    # the next call (the runner's retry) probes only the endpoint that comes back first
    calls.clear()
    clock.t += 1.0
    with pytest.raises(AllEndpointsDown, match="1 tried"):
        pool.call(once)
    assert len(calls) == 1


def test_a_single_endpoint_is_always_tried_and_keeps_its_own_error():
    clock = Clock()
    pool = pool_of((1, 1), cooldown_s=5.0, clock=clock)
    answers = iter([Unreachable("timeout after 1 s"), "ok"])

    def once(i):
        a = next(answers)
        if isinstance(a, Exception):
            raise a
        return a

    with pytest.raises(AllEndpointsDown, match=r"^timeout after 1 s$"):
        pool.call(once)
    assert pool.call(once) == (0, "ok")  # still cooling down, but it is the only one: sent


def test_other_errors_end_the_call_at_that_endpoint():
    pool = pool_of((1, 1), (1, 1))
    calls = []

    def once(i):
        calls.append(i)
        raise RuntimeError("HTTP 400: Invalid input audio.")

    with pytest.raises(RuntimeError, match="HTTP 400"):
        pool.call(once)
    assert len(calls) == 1 and all(s["unreachable"] == 0 for s in pool.stats())
    assert all(st.in_flight == 0 for st in pool._state)


# ---------------------------------------------------------------------------- the circuit breaker


class Dead:
    """`once` of an endpoint that cannot be reached (or answers, once `alive`), counting what was sent."""

    def __init__(self):
        self.sent = []
        self.alive = set()

    def __call__(self, i):
        self.sent.append(i)
        if i in self.alive:
            return f"answer from {i}"
        raise Unreachable("timeout after 1 s")


def fail(pool, once, n):
    """n calls that reach the endpoint and fail (each raises AllEndpointsDown)."""
    for _ in range(n):
        with pytest.raises(AllEndpointsDown):
            pool.call(once)


def test_the_breaker_opens_after_consecutive_failures_and_then_sends_nothing():
    clock = Clock()
    pool = pool_of(
        (1, 4), clock=clock, breaker=Breaker(failures=3, cooldown_s=10.0, max_cooldown_s=40.0, max_reopens=2)
    )
    once = Dead()
    fail(pool, once, 3)
    assert once.sent == [0, 0, 0]
    for _ in range(5):
        with pytest.raises(CircuitOpen) as info:
            pool.call(once)
        assert str(info.value) == "circuit open after 3 consecutive failures: timeout after 1 s"
        assert info.value.retry_after_s == pytest.approx(10.0) and not info.value.final
    assert once.sent == [0, 0, 0]  # failed fast: nothing was sent while it is open
    clock.t += 4.0
    with pytest.raises(CircuitOpen) as info:
        pool.call(once)
    assert info.value.retry_after_s == pytest.approx(6.0) and once.sent == [0, 0, 0]
    assert pool.stats()[0]["breaker"] == "open" and pool.stats()[0]["opens"] == 1


def test_a_success_in_between_resets_the_count():
    pool = pool_of((1, 4), clock=Clock(), breaker=Breaker(failures=3))
    once = Dead()
    fail(pool, once, 2)
    once.alive.add(0)
    assert pool.call(once) == (0, "answer from 0")
    once.alive.clear()
    fail(pool, once, 2)
    assert pool.stats()[0]["breaker"] == "closed"  # 2, 1, 2 in a row: never 3


def test_half_open_lets_exactly_one_probe_through_and_its_answer_closes_the_breaker():
    clock = Clock()
    pool = pool_of((1, 4), clock=clock, breaker=Breaker(failures=2, cooldown_s=5.0, max_cooldown_s=60.0))
    once = Dead()
    fail(pool, once, 2)
    clock.t += 5.0
    probe_out, answer = threading.Event(), threading.Event()
    outcome = {}

    def slow_probe(i):
        once.sent.append(i)
        probe_out.set()
        assert answer.wait(10)
        return "probe answered"

    def probe():
        outcome["result"] = pool.call(slow_probe)

    t = threading.Thread(target=probe)
    t.start()
    assert probe_out.wait(10)
    # while the probe is out every other call fails fast, told to look again shortly
    for _ in range(3):
        with pytest.raises(CircuitOpen) as info:
            pool.call(once)
        assert info.value.retry_after_s == PROBE_POLL_S and not info.value.final
    assert once.sent == [0, 0, 0]  # two failures, one probe
    answer.set()
    t.join(10)
    assert outcome["result"] == (0, "probe answered")
    once.alive.add(0)
    assert [pool.call(once)[1] for _ in range(3)] == ["answer from 0"] * 3
    s = pool.stats()[0]
    assert s["breaker"] == "closed" and s["opens"] == 1 and pool._state[0].failures_in_row == 0


def test_a_failed_probe_reopens_for_twice_as_long_and_the_breaker_gives_up_after_max_reopens():
    clock = Clock()
    pool = pool_of((1, 4), clock=clock, breaker=Breaker(failures=2, cooldown_s=5.0, max_cooldown_s=15.0, max_reopens=3))
    once = Dead()
    fail(pool, once, 2)
    waits = []
    for _ in range(3):
        with pytest.raises(CircuitOpen) as info:
            pool.call(once)
        waits.append(info.value.retry_after_s)
        clock.t += info.value.retry_after_s
        fail(pool, once, 1)  # the probe: sent, and it fails
    assert waits == [5.0, 10.0, 15.0]  # doubled per re-open, capped at max_cooldown_s
    assert len(once.sent) == 2 + 3
    clock.t += 1000.0
    with pytest.raises(CircuitOpen) as info:
        pool.call(once)
    assert info.value.final and info.value.retry_after_s is None and len(once.sent) == 5
    assert str(info.value) == (
        "circuit open after 5 consecutive failures (re-opened 3 times, given up for this run): timeout after 1 s"
    )
    assert pool.given_up and pool.stats()[0]["breaker"] == "given up"


def test_max_reopens_zero_gives_up_when_the_breaker_first_opens():
    pool = pool_of((1, 4), clock=Clock(), breaker=Breaker(failures=2, max_reopens=0))
    once = Dead()
    fail(pool, once, 2)
    with pytest.raises(CircuitOpen) as info:
        pool.call(once)
    assert info.value.final and once.sent == [0, 0]


def test_an_http_error_is_an_answer_and_closes_a_half_open_breaker():
    clock = Clock()
    pool = pool_of((1, 4), clock=clock, breaker=Breaker(failures=2, cooldown_s=5.0))
    fail(pool, Dead(), 2)
    clock.t += 5.0

    def bad_request(i):
        raise RuntimeError("HTTP 400: Invalid input audio.")

    with pytest.raises(RuntimeError, match="HTTP 400"):
        pool.call(bad_request)
    assert pool.stats()[0]["breaker"] == "closed"


def test_with_several_endpoints_an_open_one_gets_nothing_and_all_open_fails_fast_naming_each():
    clock = Clock()
    pool = pool_of(
        (1, 4),
        (1, 4),
        clock=clock,
        cooldown_s=1.0,
        max_cooldown_s=1.0,
        breaker=Breaker(failures=3, cooldown_s=30.0, max_cooldown_s=60.0),
    )
    once = Dead()
    once.alive.add(1)
    while pool.stats()[0]["unreachable"] < 3:  # endpoint 0 fails whenever it is picked; 1 answers
        assert pool.call(once)[0] == 1
        clock.t += 1.01  # past its fail-over cool-down: it is picked again
    assert pool.stats()[0]["breaker"] == "open"
    once.sent.clear()
    for _ in range(9):  # for its 30 s of cool-down nothing goes to 0
        assert pool.call(once)[0] == 1
        clock.t += 2.9
    assert once.sent == [1] * 9
    once.alive.clear()
    fail(pool, once, 3)  # now 1 fails too, three times in a row
    with pytest.raises(CircuitOpen) as info:
        pool.call(once)
    assert str(info.value) == (
        "every endpoint's circuit is open (2 endpoints: http://h0:8000/v1 circuit open after "
        "3 consecutive failures: timeout after 1 s; http://h1:8000/v1 circuit open after 3 "
        "consecutive failures: timeout after 1 s)"
    )
    assert info.value.retry_after_s == pytest.approx(30.0 - 1.01 - 9 * 2.9) and not info.value.final  # 0's ends first
    assert once.sent == [1] * 12


def test_an_endpoint_left_out_by_the_check_gets_nothing():
    pool = pool_of((1, 4), (1, 4), clock=Clock())
    once = Dead()
    once.alive.update({0, 1})
    pool.exclude(1, "connection refused")
    assert [pool.call(once)[0] for _ in range(6)] == [0] * 6 and once.sent == [0] * 6
    pool.exclude(0, "connection refused")
    with pytest.raises(CircuitOpen, match="left out of this run by the pre-run check: connection refused") as info:
        pool.call(once)
    assert info.value.final and pool.given_up and len(once.sent) == 6


def test_breaker_settings_are_checked_and_match_the_params_schema():
    from voicebias.params import Breaker as BreakerParams
    from voicebias.params import validate_system

    assert Breaker.from_params({}) == Breaker() == Breaker(**BreakerParams().model_dump())
    assert Breaker.from_params({"breaker": {"failures": 2, "cooldown_s": 1}}) == Breaker(failures=2, cooldown_s=1.0)
    assert Breaker().cooldown(0) == 10.0 and Breaker().cooldown(1) == 20.0 and Breaker().cooldown(9) == 120.0
    for bad, msg in [
        ({"failures": 0}, "failures"),
        ({"cooldown_s": 0}, "cooldown_s"),
        ({"max_reopens": -1}, "max_reopens"),
        ({"cooldown_s": 30, "max_cooldown_s": 10}, "shorter"),
        ({"tries": 3}, "unknown"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            Breaker.from_params({"breaker": bad})
    from voicebias.params import ParamsError

    checked = validate_system("s", "openai_compatible", {"breaker": {"failures": 2}})
    assert checked["breaker"] == {"failures": 2, "cooldown_s": 10.0, "max_cooldown_s": 120.0, "max_reopens": 3}
    with pytest.raises(ParamsError, match="systems.s.breaker.failurs: unknown key; did you mean failures"):
        validate_system("s", "openai_compatible", {"breaker": {"failurs": 2}})
    with pytest.raises(ParamsError, match="max_cooldown_s .* must be at least cooldown_s"):
        validate_system("s", "vllm_omni", {"breaker": {"cooldown_s": 30, "max_cooldown_s": 10}})


# ---------------------------------------------------------------------------- configuration


def test_parse_fills_defaults_and_rejects_what_it_cannot_use():
    eps = parse_endpoints([{"url": "http://a:1/v1", "weight": 2, "max_concurrency": 4}, "http://b:1/v1"], "x", 3)
    assert eps == [Endpoint("http://a:1/v1", 2.0, 4), Endpoint("http://b:1/v1", 1.0, 3)]
    for bad, msg in [
        ([], "non-empty"),
        ([{"url": "gpu-box:8000"}], "http"),
        ([{"url": "http://a", "weight": 0}], "weight"),
        ([{"url": "http://a", "max_concurrency": 0}], "max_concurrency"),
        ([{"url": "http://a", "port": 1}], "unknown"),
        (["http://a", "http://a"], "twice"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            parse_endpoints(bad, "x", 1)


def test_the_endpoints_file_overrides_params_and_card(tmp_path, monkeypatch):
    monkeypatch.delenv("VOICEBIAS_ENDPOINTS", raising=False)
    monkeypatch.delenv("VOICEBIAS_CACHE", raising=False)
    card = {"endpoints": [{"url": "http://card:1/v1"}]}
    params = {"base_url": "http://params:1/v1"}
    eps, source = resolve_endpoints("s", params, card, tmp_path, 4)
    assert [e.url for e in eps] == ["http://params:1/v1"] and eps[0].max_concurrency == 4
    assert [e.url for e in resolve_endpoints("s", {}, card, tmp_path, 4)[0]] == ["http://card:1/v1"]
    assert resolve_endpoints("s", {}, {}, tmp_path, 4) == ([Endpoint(None, 1.0, 4)], "default")

    default = tmp_path / ".cache" / "endpoints.json"
    assert endpoints_file(tmp_path) == default
    default.parent.mkdir()
    default.write_text(
        json.dumps(
            {
                "s": [{"url": "http://served:1/v1", "weight": 2, "max_concurrency": 6}, {"url": "http://served:2/v1"}],
                "other": [],
            }
        )
    )
    eps, source = resolve_endpoints("s", params, card, tmp_path, 4)
    assert [(e.url, e.weight, e.max_concurrency) for e in eps] == [
        ("http://served:1/v1", 2.0, 6),
        ("http://served:2/v1", 1.0, 4),
    ]
    assert source == str(default)
    assert resolve_endpoints("absent", params, card, tmp_path, 4)[1] == "systems.absent"  # no entry: params

    moved = tmp_path / "elsewhere.json"
    moved.write_text(json.dumps({"s": ["http://moved:1/v1"]}))
    monkeypatch.setenv("VOICEBIAS_ENDPOINTS", "elsewhere.json")  # relative to the project root
    assert [e.url for e in resolve_endpoints("s", params, card, tmp_path, 4)[0]] == ["http://moved:1/v1"]
    moved.write_text("{not json")
    with pytest.raises(ConfigError, match="elsewhere.json"):
        resolve_endpoints("s", params, card, tmp_path, 4)


def test_naming_both_endpoints_and_base_url_is_an_error():
    with pytest.raises(ConfigError, match="both"):
        resolve_endpoints("s", {"base_url": "http://a/v1", "endpoints": ["http://b/v1"]}, {}, None, 1)
