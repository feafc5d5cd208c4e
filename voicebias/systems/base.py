"""The model contracts of the systems under test.

Two kinds of system, one request/response shape each: a speech-to-speech system (:class:`S2SSystem`)
takes audio plus a native-language prompt and returns output audio plus its own transcript; a
continuation system (:class:`ContinuationSystem`) takes an audio prompt and returns a continuation,
with text when it has a text stream. A call that fails is returned as failed with its reason (or
raises), never replaced by an invented output; retryable failures raise TransientError, a system
that cannot run on this machine raises SetupError when built, and :meth:`SystemUnderTest.check`
asks the servers before the first request. Also here: seeds, deploy provenance, endpoint checks.

See docs/systems.md, "The contract".
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from voicebias.clients.endpoints import EndpointPool, Unreachable
from voicebias.errors import SetupError
from voicebias.secrets import redact  # noqa: F401  (the adapters' redaction, kept importable here)

#: Prompt and continuation lengths of the speech-continuation protocol (SC paper), in s.
CONTINUATION_PROMPT_S = (3.0, 5.0)
CONTINUATION_OUTPUT_S = (5.0, 8.0)

#: Parameter keys that steer how the runner calls a system, not what the system says:
#: they are left out of the cache key, so tuning them never repeats a finished call.
RUNNER_KEYS = frozenset(
    {
        "max_concurrency",
        "batch_size",
        "timeout_s",
        "retry",
        "base_url",
        "endpoints",
        "api_key_env",
        "python",
        "checkout",
        "weights",
        "device",
        "asr",
        "startup_timeout_s",
        "breaker",
        "driver",  # a path: the repository adapters put the driver's sha256 in the key instead
    }
)

#: Card keys that say where a system is served, not what it is: left out of the cache key,
#: so moving a model to other servers (or to several) never repeats a finished call.
DEPLOY_CARD_KEYS = frozenset({"base_url", "endpoints", "api_key_env"})

#: Provenance keys that name where a call went (the endpoint's address, the model's path on
#: that server's machine, and how that server's revision was checked): they change with the
#: number of endpoints and which one answered, so they stay in the cache entry (untracked) and
#: are left out of the responses table, which must not depend on them.
DEPLOY_PROVENANCE = frozenset({"endpoint", "served_root", "revision_check"})


@dataclass(frozen=True)
class S2SRequest:
    stimulus_id: str
    lang: str  # source language of the audio
    target_lang: str  # language the answer should be in
    task: str
    prompt: str
    audio_path: str
    audio_sha256: str
    seed: int
    #: repeat index of this answer (run.samples_per_item); `seed` is sample_seed(base, stimulus_id, sample)
    sample: int = 0


@dataclass(frozen=True)
class ContinuationRequest:
    """An audio prompt to continue. `continuation_s` is the requested continuation length (s)."""

    stimulus_id: str
    lang: str
    task: str
    audio_path: str
    audio_sha256: str
    seed: int
    continuation_s: float = 6.0
    prompt: str = ""  # continuation systems take no instruction; kept for a uniform table
    sample: int = 0  # repeat index, as S2SRequest.sample

    @property
    def target_lang(self) -> str:
        return self.lang


Request = S2SRequest | ContinuationRequest


@dataclass
class S2SResponse:
    """What a system returned. `transcript` is the system's own text stream (None if it has none).

    `audio_flac`, optional, is the file `voicebias.audio.write_audio` writes for `audio` at
    `sample_rate`, when the system already has it (a render it kept): the response cache
    then stores these bytes instead of encoding the audio again."""

    status: str  # 'ok' or 'failed'
    transcript: str | None = None
    audio: np.ndarray | None = None
    sample_rate: int | None = None
    error: str = ""
    provenance: dict[str, Any] = field(default_factory=dict)
    audio_flac: bytes | None = None

    @classmethod
    def failed(cls, reason: str, **provenance: Any) -> "S2SResponse":
        return cls(status="failed", error=reason, provenance=dict(provenance))


#: Continuation systems answer with the same response shape.
Response = S2SResponse


class SystemUnderTest(ABC):
    """What the runner needs from any system: a name, its card, its params and `call`.

    `max_concurrency` (threads calling the system at once; API systems) and
    `batch_size` (requests per `call_batch`; local GPU systems) come from the
    system's params, else its card, else the class default.
    """

    #: 's2s' or 'continuation'
    kind: str = ""
    #: bounded concurrency for API systems; local systems batch instead
    max_concurrency: int = 1
    #: requests handed to `call_batch` at once
    batch_size: int = 1

    def __init__(self, name: str, card: dict[str, Any], params: dict[str, Any]):
        self.name = name
        self.card = card
        self.params = params
        for knob in ("max_concurrency", "batch_size"):
            value = params.get(knob, card.get(knob, getattr(type(self), knob)))
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"system '{name}': {knob} must be a positive integer, got {value!r}")
            setattr(self, knob, value)

    @abstractmethod
    def call(self, request: Any) -> S2SResponse:
        """Run one request; raise TransientError for retryable failures."""

    def call_batch(self, requests: Sequence[Any]) -> list[S2SResponse]:
        """Batching hook for local GPU systems: one response per request, in order.

        The default runs the requests one by one; an adapter that can batch
        overrides this. An exception fails (or, if transient, retries) the batch;
        the runner then retries its items one by one so one bad input cannot sink
        the others.
        """
        return [self.call(r) for r in requests]

    def voice(self, lang: str) -> str:
        """The fixed output voice for answers in `lang` (params `voice` overrides the card)."""
        if self.params.get("voice"):
            return str(self.params["voice"])
        voices = self.card.get("output_voice") or {}
        if isinstance(voices, str):
            return voices
        if lang not in voices:
            raise ValueError(f"system '{self.name}': the card names no output voice for '{lang}'")
        return str(voices[lang])

    def generation_settings(self) -> dict[str, Any]:
        """Everything besides the request that changes the output (part of the cache key)."""
        return {k: v for k, v in self.params.items() if k not in RUNNER_KEYS}

    def request_settings(self, request: Any) -> dict[str, Any]:
        """What this adapter derives per request that changes its answer beyond the request's
        own fields (part of the cache key; empty by default): e.g. a seed per item, which
        keeps two stimuli with the same audio from sharing one answer."""
        return {}

    def check(self) -> None:
        """Before the first request of a run: can this system be reached, and does it take its
        credentials? Raise :class:`SetupError` with a one-line message when it cannot run.

        The default checks nothing (a system that runs on this machine, e.g. the reference
        systems); API and served adapters ask their endpoints (:func:`ask_endpoints`) with a
        short timeout (:data:`CHECK_TIMEOUT_S`). The runner calls it once per run, and only
        when some request is not in the cache.
        """

    @property
    def probed(self) -> bool:
        """Whether the determinism probe (run.determinism_probe) re-sends some of this system's requests:
        true for systems behind a server or an API, whose seeds the audit cannot see being used."""
        return False

    def run_facts(self) -> dict[str, Any]:
        """Facts of this run only (e.g. requests per endpoint): they go to the run log, never to a tracked output."""
        return {}

    def close(self) -> None:
        """Release clients, worker processes or GPU memory (the runner calls this at the end)."""


class S2SSystem(SystemUnderTest):
    """A speech-to-speech system under test. Subclasses implement `respond`."""

    kind = "s2s"

    @abstractmethod
    def respond(self, request: S2SRequest) -> S2SResponse:
        """Run one request; raise TransientError for retryable failures."""

    def call(self, request: S2SRequest) -> S2SResponse:
        return self.respond(request)


class ContinuationSystem(SystemUnderTest):
    """A speech-continuation system under test. Subclasses implement `continue_speech`.

    `text_stream` says whether the system writes text alongside its audio (SpiritLM
    can, in interleaved mode); without one the runner transcribes the output.
    """

    kind = "continuation"
    text_stream: bool = False

    @abstractmethod
    def continue_speech(self, request: ContinuationRequest) -> S2SResponse:
        """Continue one audio prompt; raise TransientError for retryable failures."""

    def call(self, request: ContinuationRequest) -> S2SResponse:
        return self.continue_speech(request)


# ---------------------------------------------------------------------------
# helpers shared by the adapters

#: the longest the pre-run check waits for one endpoint's answer (s)
CHECK_TIMEOUT_S = 10.0

R = TypeVar("R")


def ask_endpoints(
    system: str, pool: EndpointPool, ask: Callable[[int], R], report: Callable[[str], Any] | None = None, hint: str = ""
) -> dict[int, R]:
    """Ask every endpoint of `pool` at once, `ask(i)`; {endpoint: answer} of those that answered.

    `ask` raises :class:`~voicebias.clients.endpoints.Unreachable` when endpoint `i` cannot
    be reached (refused, timed out) and :class:`SetupError` when it answers in a way that
    stops the run (credentials refused, another model). An endpoint that cannot be reached
    is left out of this run (:meth:`EndpointPool.exclude`) and named in one line on stderr
    (`report`), as long as one answers; when none does, SetupError names them all, followed
    by `hint` (what to do).
    """
    report = report if report is not None else (lambda line: print(line, file=sys.stderr))
    n = len(pool.endpoints)

    def one(i: int) -> tuple[str, Any]:
        try:
            return "ok", ask(i)
        except Unreachable as exc:
            return "down", str(exc)
        except SetupError as exc:
            return "setup", exc

    if n == 1:
        outcomes = [one(0)]
    else:
        with ThreadPoolExecutor(max_workers=min(n, 16), thread_name_prefix=f"{system}-check") as ex:
            outcomes = list(ex.map(one, range(n)))
    for kind, value in outcomes:
        if kind == "setup":
            raise value
    down = {i: why for i, (kind, why) in enumerate(outcomes) if kind == "down"}
    if len(down) == n:
        if n == 1:
            raise SetupError(f"system '{system}': cannot reach {pool.endpoints[0].label} ({down[0]}){hint}")
        raise SetupError(
            f"system '{system}': cannot reach any of its {n} endpoints: "
            + "; ".join(f"{pool.endpoints[i].label} ({why})" for i, why in down.items())
            + hint
        )
    for i, why in down.items():
        pool.exclude(i, why)
    if down:
        report(
            f"system '{system}': {len(down)} of {n} endpoints do not answer, left out of this run: "
            + "; ".join(f"{pool.endpoints[i].label} ({why})" for i, why in down.items())
        )
    return {i: value for i, (kind, value) in enumerate(outcomes) if kind == "ok"}


def item_seed(base: int, item_id: str) -> int:
    """A seed of its own for one item (a stimulus id), derived from the run's base seed.

    base + the first 32 bits of sha256(item_id), modulo 2**32: the same rule the
    phonation stage uses for its per-stimulus seeds, so the two agree. Deterministic
    across processes and machines (no Python hash randomisation).
    """
    import hashlib

    return (int(base) + int(hashlib.sha256(str(item_id).encode()).hexdigest()[:8], 16)) % (2**32)


def sample_seed(base: int, item_id: str, sample: int) -> int:
    """The request seed of answer `sample` (0, 1, ...) to one item when several are drawn per item.

    Sample 0 keeps the run's base seed, the seed of a run with one answer per item, so its
    cache key and its answer are that run's. Sample s >= 1 gets ``item_seed(base,
    f"{item_id}/sample-{s}")``, a seed of its own derived from (base, item id, s); an
    adapter that derives a per-item seed from the request seed (item_seed(request.seed,
    stimulus_id), or a random stream of (seed, stimulus id)) then draws another answer for
    every sample.

    >>> sample_seed(7, "en-feminine-01-male", 0)
    7
    >>> len({sample_seed(7, "en-feminine-01-male", s) for s in range(5)})
    5
    """
    if isinstance(sample, bool) or not isinstance(sample, int) or sample < 0:
        raise ValueError(f"sample must be an integer >= 0, got {sample!r}")
    return int(base) if sample == 0 else item_seed(base, f"{item_id}/sample-{sample}")


def replicate_seed(base: int, replicate: int) -> int:
    """The base seed of whole-run replicate `replicate` (run.replicates): replicate 0 is the run
    itself, with the run's base seed; replicate r >= 1 runs every request again under
    ``item_seed(base, f"replicate-{r}")``, so each request's seed (sample_seed of that base), its
    cache key and, for a system that honours seeds, its answer are new.

    >>> replicate_seed(7, 0)
    7
    >>> len({replicate_seed(7, r) for r in range(5)})
    5
    """
    if isinstance(replicate, bool) or not isinstance(replicate, int) or replicate < 0:
        raise ValueError(f"replicate must be an integer >= 0, got {replicate!r}")
    return int(base) if replicate == 0 else item_seed(base, f"replicate-{replicate}")
