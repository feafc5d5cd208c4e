"""One system's requests shared across several endpoints: a weighted pick, bounded concurrency
per endpoint, and fail-over away from an endpoint that cannot be reached.

:func:`resolve_endpoints` takes the list from the untracked endpoints file, else the system's
params, else its card; endpoints are deploy facts, out of the cache key and every tracked output.
:class:`EndpointPool` hands each request to one endpoint at a time (a smooth weighted round-robin
among those up with a free slot), sets aside one that is :class:`Unreachable` and moves the request
on, and raises :class:`AllEndpointsDown` when every one has been tried. Each endpoint also has a
circuit breaker (:class:`Breaker`): a call that finds none it may send to raises
:class:`CircuitOpen` at once. A request stops at the first answer, so none is sent twice.

The pick, the cool-downs and the breaker's states: docs/endpoints.md.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, TypeVar
from urllib.parse import urlsplit

from voicebias.errors import ConfigError, VoicebiasError
from voicebias.secrets import url_credentials

T = TypeVar("T")

#: Environment variable naming the endpoints file (relative paths are read from the project root).
ENDPOINTS_ENV = "VOICEBIAS_ENDPOINTS"
ENDPOINTS_FILE = "endpoints.json"
ENDPOINT_KEYS = frozenset({"url", "weight", "max_concurrency"})
#: the key of a bearer token, allowed in the endpoints file only (voicebias serve writes the shims' tokens there)
TOKEN_KEY = "token"
#: the key of the model revision a server was started with, in the endpoints file only (voicebias serve
#: records the `--revision` it passed to vLLM, so an adapter can verify what the server loaded)
REVISION_KEY = "revision"


@dataclass(frozen=True)
class Endpoint:
    """One server of a system. `url` None means the client's own default (the public API)."""

    url: str | None
    weight: float = 1.0
    max_concurrency: int = 1
    #: a bearer token the server wants (from the endpoints file only); never in a label, log or record
    token: str | None = field(default=None, repr=False, compare=False)
    #: the revision the server was started with, as `voicebias serve` recorded it (endpoints file only)
    revision: str | None = field(default=None, compare=False)

    def headers(self) -> dict[str, str]:
        """The Authorization header this endpoint wants, if any."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def label(self) -> str:
        return safe_url(self.url) if self.url else "default"


def safe_url(url: str) -> str:
    """scheme://host[:port]/path of `url`: no credentials, no query."""
    u = urlsplit(str(url))
    return f"{u.scheme}://{u.hostname}{f':{u.port}' if u.port else ''}{u.path}"


def connection_reason(exc: BaseException) -> str:
    """What a failed connection came to, for messages: "connection refused" when a refusal is anywhere
    in the exception's chain of causes, else "connection error: " and the innermost cause's message."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    inner = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        inner = cause
        cause = cause.__cause__ or cause.__context__
    return f"connection error: {inner}"


# ---------------------------------------------------------------------------- configuration


def endpoints_file(root: Path | None = None) -> Path:
    """The endpoints file: $VOICEBIAS_ENDPOINTS, else endpoints.json in $VOICEBIAS_CACHE or <root>/.cache."""
    env = os.environ.get(ENDPOINTS_ENV)
    if env:
        p = Path(env).expanduser()
        return p if p.is_absolute() or root is None else Path(root) / p
    if os.environ.get("VOICEBIAS_CACHE"):
        return Path(os.environ["VOICEBIAS_CACHE"]) / ENDPOINTS_FILE
    if root is None:
        from voicebias.config import CACHE_DIR

        return CACHE_DIR / ENDPOINTS_FILE
    return Path(root) / ".cache" / ENDPOINTS_FILE


def read_endpoints_file(system: str, path: Path) -> list[Any] | None:
    """The raw endpoint list the file names for `system`, or None (no file, or no entry for it)."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"endpoints file {path} cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"endpoints file {path} must hold {{system: [{{url, weight, max_concurrency}}, ...]}}")
    return data.get(system)


def parse_endpoints(spec: Any, where: str, default_concurrency: int, tokens: bool = False) -> list[Endpoint]:
    """Check an endpoint list (`where` names it in errors); fill in weight 1 and the default concurrency.
    A `token` is read only where `tokens` says the list is the endpoints file; in params or a card
    (tracked files) it is refused without being repeated."""
    if not isinstance(spec, (list, tuple)) or not spec:
        raise ConfigError(f"{where}: 'endpoints' must be a non-empty list of {{url, weight, max_concurrency}}")
    out: list[Endpoint] = []
    for i, item in enumerate(spec):
        at = f"{where}: endpoints[{i}]"
        if isinstance(item, str):
            item = {"url": item}
        if not isinstance(item, Mapping):
            raise ConfigError(f"{at} must be a mapping with 'url', got {item!r}")
        if TOKEN_KEY in item and not tokens:
            raise ConfigError(
                f"{at}: a 'token' does not belong here (it would reach git, dvc.lock and MLflow); voicebias serve "
                "writes its shims' tokens into the untracked endpoints file"
            )
        token = item.get(TOKEN_KEY)
        if token is not None and (not isinstance(token, str) or not token.strip()):
            raise ConfigError(f"{at}: 'token' must be a non-empty string")
        if REVISION_KEY in item and not tokens:
            raise ConfigError(
                f"{at}: a 'revision' is recorded by voicebias serve in the endpoints file; the card's "
                "'revision' says which one the audit expects"
            )
        revision = item.get(REVISION_KEY)
        if revision is not None and (not isinstance(revision, str) or not revision.strip()):
            raise ConfigError(f"{at}: 'revision' must be a non-empty string")
        unknown = set(item) - ENDPOINT_KEYS - {TOKEN_KEY, REVISION_KEY}
        if unknown:
            raise ConfigError(f"{at}: unknown key(s) {sorted(unknown)}; use url, weight, max_concurrency")
        url = item.get("url")
        wrong = url_credentials(url) if isinstance(url, str) else None
        if wrong:  # the value is not repeated
            raise ConfigError(f"{at}: 'url' {wrong}")
        if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
            raise ConfigError(f"{at}: 'url' must be an http(s) address such as http://gpu-box:8000/v1, got {url!r}")
        weight = item.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"{at}: 'weight' must be a positive number, got {weight!r}")
        cap = item.get("max_concurrency", default_concurrency)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ConfigError(f"{at}: 'max_concurrency' must be a positive integer, got {cap!r}")
        out.append(
            Endpoint(
                url=url,
                weight=float(weight),
                max_concurrency=cap,
                token=token.strip() if token else None,
                revision=revision.strip() if revision else None,
            )
        )
    urls = [e.url for e in out]
    if len(set(urls)) != len(urls):
        raise ConfigError(f"{where}: an endpoint url is listed twice")
    return out


def resolve_endpoints(
    system: str,
    params: Mapping[str, Any],
    card: Mapping[str, Any],
    root: Path | None,
    default_concurrency: int,
    default_url: str | None = None,
) -> tuple[list[Endpoint], str]:
    """(the system's endpoints, where they came from): the endpoints file, else params, else the card.

    A source that names both `endpoints` and `base_url` is an error. Without any, one
    endpoint at `default_url` (None: the client's own default).
    """
    path = endpoints_file(root)
    listed = read_endpoints_file(system, path)
    if listed is not None:
        return parse_endpoints(listed, f"{path} [{system}]", default_concurrency, tokens=True), str(path)
    for source, where in ((params, f"systems.{system}"), (card, f"the card of '{system}'")):
        many, one = source.get("endpoints"), source.get("base_url")
        if many and one:
            raise ConfigError(f"{where} names both 'endpoints' and 'base_url'; keep one")
        if many:
            return parse_endpoints(many, where, default_concurrency), where
        if one:
            return parse_endpoints([{"url": one}], where, default_concurrency), where
    return [Endpoint(url=default_url, max_concurrency=default_concurrency)], "default"


# ---------------------------------------------------------------------------- the circuit breaker

BREAKER_KEYS = ("failures", "cooldown_s", "max_cooldown_s", "max_reopens")
#: how often a request waiting on a half-open endpoint looks again while its probe is out (s)
PROBE_POLL_S = 0.25


@dataclass(frozen=True)
class Breaker:
    """When an endpoint's circuit breaker opens, for how long, and when it gives up (params ``breaker``).

    Parameters
    ----------
    failures
        Consecutive failures to reach an endpoint (refused or dropped connection, timeout)
        that open its breaker.
    cooldown_s
        How long it stays open the first time (s); each re-open doubles it.
    max_cooldown_s
        The longest cool-down (s).
    max_reopens
        Re-opens in a row (probes that failed) after which the breaker stays open for the
        rest of the run; 0 gives up the first time it opens.
    """

    failures: int = 5
    cooldown_s: float = 10.0
    max_cooldown_s: float = 120.0
    max_reopens: int = 3

    def __post_init__(self) -> None:
        for key in ("failures", "max_reopens"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if key == "failures" else 0):
                raise ConfigError(f"breaker.{key} must be an integer >= {1 if key == 'failures' else 0}, got {v!r}")
        for key in ("cooldown_s", "max_cooldown_s"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"breaker.{key} must be a positive number of seconds, got {v!r}")
        if self.max_cooldown_s < self.cooldown_s:
            raise ConfigError(
                f"breaker.max_cooldown_s ({self.max_cooldown_s:g}) is shorter than breaker.cooldown_s "
                f"({self.cooldown_s:g})"
            )

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "Breaker":
        """The system params' ``breaker`` mapping (absent or empty: the defaults)."""
        spec = params.get("breaker") or {}
        if not isinstance(spec, Mapping):
            raise ConfigError(f"'breaker' must be a mapping of {', '.join(BREAKER_KEYS)}, got {spec!r}")
        unknown = set(spec) - set(BREAKER_KEYS)
        if unknown:
            raise ConfigError(f"unknown breaker setting(s) {sorted(unknown)}; use {', '.join(BREAKER_KEYS)}")
        return cls(**dict(spec))

    def cooldown(self, reopens: int) -> float:
        """The cool-down after `reopens` re-opens in a row (s): cooldown_s doubled per re-open, capped."""
        return min(self.cooldown_s * 2.0**reopens, self.max_cooldown_s)


# ---------------------------------------------------------------------------- the pool


class Unreachable(VoicebiasError):
    """Raised by one try: this endpoint could not be reached (refused, dropped, timed out)."""


class AllEndpointsDown(VoicebiasError):
    """Every endpoint this call could use is down; `retry_after_s` is when the first comes back."""

    def __init__(self, message: str, retry_after_s: float | None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CircuitOpen(VoicebiasError):
    """No endpoint may be sent this request now (every breaker open, or half-open with its probe out,
    or the endpoint left out by the pre-run check); nothing was sent.

    `retry_after_s`: when to ask again (s). `final`: every endpoint has given up for this run, so
    nothing will be sent any more.
    """

    def __init__(self, message: str, retry_after_s: float | None, final: bool):
        super().__init__(message)
        self.retry_after_s, self.final = retry_after_s, final


@dataclass
class _State:
    in_flight: int = 0
    max_in_flight: int = 0
    sent: int = 0
    answered: int = 0
    unreachable: int = 0
    down_until: float = 0.0
    failures_in_row: int = 0
    current: float = 0.0  # smooth weighted round-robin
    last_error: str = ""
    # the circuit breaker
    opened: bool = False  # open, or half-open once open_until has passed
    open_until: float = 0.0
    reopens: int = 0  # probes that failed in a row
    probing: bool = False  # the half-open probe is out
    gave_up: bool = False
    opens: int = 0  # times it opened this run
    excluded: str = ""  # why the pre-run check left it out of this run


class EndpointPool:
    """Pick, bound and fail over among `endpoints`, each behind a circuit breaker (see the module docstring)."""

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        name: str = "",
        cooldown_s: float = 2.0,
        max_cooldown_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        report: Callable[[str], Any] | None = None,
        breaker: Breaker | None = None,
    ):
        if not endpoints:
            raise ValueError("an endpoint pool needs at least one endpoint")
        self.endpoints = list(endpoints)
        self.name = name
        self.cooldown_s, self.max_cooldown_s = float(cooldown_s), float(max_cooldown_s)
        self.breaker = breaker or Breaker()
        self.clock = clock
        self.report = report if report is not None else (lambda line: print(line, file=sys.stderr))
        self._state = [_State() for _ in self.endpoints]
        self._cond = threading.Condition()

    @property
    def capacity(self) -> int:
        """Requests the pool can have in flight at once: the sum of the endpoints' max_concurrency."""
        return sum(e.max_concurrency for e in self.endpoints)

    def call(self, once: Callable[[int], T]) -> tuple[int, T]:
        """(index of the endpoint that answered, `once(index)`'s result).

        `once` raises :class:`Unreachable` to move the request to another endpoint;
        anything else it raises ends the call with that exception (the server answered).
        Raises :class:`CircuitOpen`, without sending, when no endpoint may be sent to now.
        """
        tried: list[int] = []
        errors: list[str] = []
        while True:
            picked = self._acquire(tried)
            if picked is None:
                raise self._all_down(tried, errors)
            i, probe = picked
            tried.append(i)
            try:
                result = once(i)
            except Unreachable as exc:
                errors.append(str(exc))
                self._release(i, probe, reachable=False, error=str(exc))
                continue
            except Exception:
                self._release(i, probe, reachable=True)  # an error the server answered with: it is up
                raise
            except BaseException:
                self._release(i, probe, reachable=None)
                raise
            self._release(i, probe, reachable=True)
            return i, result

    def exclude(self, i: int, reason: str) -> None:
        """Leave endpoint `i` out of this run (it did not answer the pre-run check): nothing is sent there."""
        with self._cond:
            self._state[i].excluded = reason or "left out"
            self._cond.notify_all()

    @property
    def given_up(self) -> bool:
        """Whether no endpoint will be sent anything more in this run (every breaker gave up, or left out)."""
        with self._cond:
            return all(s.gave_up or s.excluded for s in self._state)

    def stats(self) -> list[dict[str, Any]]:
        """Per endpoint: label, weight, max_concurrency, sent, answered, unreachable, max_in_flight,
        breaker (closed, open, given up or left out) and opens (times its breaker opened)."""
        with self._cond:
            return [
                {
                    "endpoint": e.label,
                    "weight": e.weight,
                    "max_concurrency": e.max_concurrency,
                    "sent": s.sent,
                    "answered": s.answered,
                    "unreachable": s.unreachable,
                    "max_in_flight": s.max_in_flight,
                    "breaker": self._circuit(s),
                    "opens": s.opens,
                }
                for e, s in zip(self.endpoints, self._state)
            ]

    # -- internals -----------------------------------------------------------
    @staticmethod
    def _circuit(s: _State) -> str:
        return "left out" if s.excluded else "given up" if s.gave_up else "open" if s.opened else "closed"

    def _acquire(self, tried: Sequence[int]) -> tuple[int, bool] | None:
        """(endpoint, whether this request is its half-open probe), or None when this call has tried every
        endpoint it could; raises CircuitOpen when it may send nowhere."""
        with self._cond:
            while True:
                now = self.clock()
                usable = [i for i in range(len(self.endpoints)) if i not in tried and not self._state[i].excluded]
                closed = [i for i in usable if not self._state[i].opened]
                half_open = [i for i in usable if self._half_open(self._state[i], now)]
                choices = [i for i in closed if self._state[i].down_until <= now] + half_open
                if not choices:
                    if closed and not tried:
                        # every closed endpoint is cooling down: probe the one whose cool-down ends first
                        choices = [min(closed, key=lambda j: (self._state[j].down_until, j))]
                    elif tried:
                        return None  # every endpoint left to this call is cooling down or open
                    else:
                        raise self._circuit_open(usable, now)
                free = [i for i in choices if self._state[i].in_flight < self.endpoints[i].max_concurrency]
                if free:
                    i = self._pick(free)
                    s = self._state[i]
                    probe = s.opened
                    s.probing = s.probing or probe
                    s.in_flight += 1
                    s.sent += 1
                    s.max_in_flight = max(s.max_in_flight, s.in_flight)
                    return i, probe
                recovering = [
                    t - now for j in usable for t in (self._state[j].down_until, self._state[j].open_until) if t > now
                ]
                self._cond.wait(timeout=min(recovering) if recovering else None)

    @staticmethod
    def _half_open(s: _State, now: float) -> bool:
        return s.opened and not s.gave_up and not s.probing and s.open_until <= now

    def _pick(self, free: Sequence[int]) -> int:
        """Smooth weighted round-robin among `free` (nginx's rule): deterministic, shares follow weights."""
        total = 0.0
        for i in free:
            self._state[i].current += self.endpoints[i].weight
            total += self.endpoints[i].weight
        best = max(free, key=lambda i: (self._state[i].current, -i))
        self._state[best].current -= total
        return best

    def _release(self, i: int, probe: bool, reachable: bool | None, error: str = "") -> None:
        lines = []
        label = f"{self.name or 'system'}: endpoint {self.endpoints[i].label}"
        with self._cond:
            s = self._state[i]
            b = self.breaker
            s.in_flight -= 1
            if probe:
                s.probing = False
            now = self.clock()
            if reachable:
                s.answered += 1
                if s.opened:
                    lines.append(f"{label} answers again; its circuit is closed")
                s.failures_in_row, s.down_until = 0, 0.0
                s.opened, s.open_until, s.reopens, s.gave_up = False, 0.0, 0, False
            elif reachable is False:
                s.unreachable += 1
                s.last_error = error
                s.failures_in_row += 1
                if probe:  # the half-open probe failed: open again, for longer, or give up
                    s.reopens += 1
                    s.gave_up = s.reopens >= b.max_reopens
                    s.open_until = now + b.cooldown(s.reopens)
                    lines.append(
                        f"{label}: the probe failed ({error}); "
                        + (
                            f"circuit given up for this run after {s.reopens} re-opens in a row"
                            if s.gave_up
                            else f"circuit open again for {b.cooldown(s.reopens):g} s"
                        )
                    )
                elif not s.opened and s.failures_in_row >= b.failures:
                    s.opened, s.open_until, s.opens = True, now + b.cooldown(0), s.opens + 1
                    s.gave_up = b.max_reopens == 0
                    lines.append(
                        f"{label}: circuit open after {s.failures_in_row} consecutive failures ({error}); "
                        + (
                            "given up for this run"
                            if s.gave_up
                            else f"nothing is sent there for {b.cooldown(0):g} s, then one probe"
                        )
                    )
                elif not s.opened and s.down_until <= now:
                    # requests already in flight when it went down do not lengthen its cool-down
                    wait = min(self.cooldown_s * 2.0 ** (s.failures_in_row - 1), self.max_cooldown_s)
                    s.down_until = now + wait
                    if len(self.endpoints) > 1:
                        lines.append(f"{label} unreachable ({error}); sending elsewhere for {wait:g} s")
                # else: a request sent before its breaker opened failed late; it changes nothing
            self._cond.notify_all()
        for line in lines:
            self.report(line)

    def _circuit_open(self, usable: Sequence[int], now: float) -> CircuitOpen:
        """What a call that may send nowhere raises (the caller holds the lock)."""
        live = [i for i in usable if not self._state[i].gave_up]
        waits = [max(self._state[i].open_until - now, 0.0) for i in live if not self._state[i].probing]
        retry = None if not live else min(waits) if waits else PROBE_POLL_S
        parts = []
        for i, (e, s) in enumerate(zip(self.endpoints, self._state)):
            if s.excluded:
                parts.append((e.label, f"left out of this run by the pre-run check: {s.excluded}"))
            else:
                given = f" (re-opened {s.reopens} times, given up for this run)" if s.gave_up else ""
                parts.append(
                    (e.label, f"circuit open after {s.failures_in_row} consecutive failures{given}: {s.last_error}")
                )
        if len(parts) == 1:
            return CircuitOpen(parts[0][1], retry, final=not live)
        return CircuitOpen(
            f"every endpoint's circuit is open ({len(parts)} endpoints: "
            + "; ".join(f"{label} {why}" for label, why in parts)
            + ")",
            retry,
            final=not live,
        )

    def _all_down(self, tried: Sequence[int], errors: Sequence[str]) -> AllEndpointsDown:
        with self._cond:
            now = self.clock()
            waits = [max(max(s.down_until, s.open_until) - now, 0.0) for s in self._state if not s.excluded]
        hint = min(waits) if waits else None
        if len(self.endpoints) == 1 and errors:
            return AllEndpointsDown(errors[-1], hint)
        reasons = "; ".join(dict.fromkeys(errors)) or "none tried in this call"
        return AllEndpointsDown(
            f"every endpoint is down ({len(self.endpoints)} endpoints, {len(tried)} tried in this call: {reasons})",
            hint,
        )
