"""Run one system on one task over every stimulus: cached, resumable, retrying, concurrent.

Each call is keyed by a hash of what decides its answer and stored before it is reported, so an
interrupted stage resumes and no finished call is repeated; transient failures are retried with
backoff, and a call that still fails is recorded as failed (never filled in) and asked again on
the next run. Served systems stop early once every endpoint's circuit breaker has given up.
Replies are screened (voicebias.systems.screen) and the table is built in stimulus-id order from
the cache entries, so it is byte-identical however the run was served. With repeats
(`run.samples_per_item` > 1) every stimulus gets k seeded samples.

The cache key, breakers, provenance, table order and repeats: docs/systems.md, "The runner".
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
from tqdm import tqdm

from voicebias.audio import flac_matches, sha256_file, write_audio
from voicebias.cache import JsonCache, atomic_write_json, content_key
from voicebias.clients.endpoints import PROBE_POLL_S, CircuitOpen
from voicebias.clients.retry import backoff_s
from voicebias.contract import (
    CALL_FAILED,
    CONTINUATION_COLUMNS,
    GENDERS,
    LANGUAGES,
    NO_TRANSCRIPT,
    REPLY_REASONS,
    RESPONSE_COLUMNS,
    RESPONSE_STATUSES,
    RESPONSE_STIMULUS_COLUMNS,
    SAMPLE,
    with_sample,
)
from voicebias.errors import ConfigError, SetupError, TransientError
from voicebias.systems.base import (
    DEPLOY_CARD_KEYS,
    DEPLOY_PROVENANCE,
    ContinuationRequest,
    S2SRequest,
    S2SResponse,
    SystemUnderTest,
    sample_seed,
)
from voicebias.systems.screen import ReplyScreen, file_facts
from voicebias.tasks import Task
from voicebias.validation import ValidationReport, expectations, require_valid, where


def _retry_default(field: str) -> Any:
    from voicebias.params import Retry

    return Retry.model_fields[field].default


@dataclass
class RetryPolicy:
    """Exponential backoff: base_delay_s, then x2 per attempt, capped at max_delay_s (s); the defaults
    are the schema's (voicebias.params.Retry)."""

    max_attempts: int = _retry_default("max_attempts")
    base_delay_s: float = _retry_default("base_delay_s")
    max_delay_s: float = _retry_default("max_delay_s")

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "RetryPolicy":
        """The policy of a system's `retry` settings, checked against the schema (an unknown key or a
        negative delay is a ParamsError naming it)."""
        from voicebias.params import Retry, validate_section

        return cls(**validate_section(Retry, params.get("retry"), "retry"))


def cache_key(system: SystemUnderTest, request: S2SRequest | ContinuationRequest) -> str:
    """The call's content key. Where the system is served (the card's base_url, endpoints) is no part of it."""
    card = {k: v for k, v in system.card.items() if k not in DEPLOY_CARD_KEYS}
    payload = {
        "card": card,
        "settings": system.generation_settings(),
        "task": request.task,
        "prompt": request.prompt,
        "audio_sha256": request.audio_sha256,
        "target_lang": request.target_lang,
        "seed": request.seed,
    }
    if isinstance(request, ContinuationRequest):
        payload["continuation_s"] = request.continuation_s
    if request.sample:  # a repeat answer; sample 0 is keyed as a request of a run without repeats
        payload["sample"] = request.sample
    per_request = system.request_settings(request)
    if per_request:  # only then: the keys of adapters without any stay as they were
        payload["request_settings"] = per_request
    return content_key(payload)


#: the shortest wait before asking a breaker again (s), so a zero hint never spins
MIN_WAIT_S = 0.01


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _wait_s(policy: RetryPolicy, attempt: int, exc: TransientError) -> float:
    """The wait after failed attempt `attempt` (1-based): the backoff, or the server's longer hint, capped."""
    return min(
        max(backoff_s(attempt - 1, policy.base_delay_s, policy.max_delay_s), exc.retry_after_s or 0.0),
        policy.max_delay_s,
    )


def call_with_retries(
    system: SystemUnderTest,
    request: Any,
    policy: RetryPolicy,
    sleep: Callable[[float], Any] = time.sleep,
    errors: list[str] | None = None,
    gave_up: list[str] | None = None,
) -> tuple[S2SResponse, int]:
    """(response, attempts). Transient errors retry with backoff; others fail at once.

    The wait before attempt k+1 is base_delay_s * 2**(k-1), capped at max_delay_s,
    or the server's Retry-After hint if that is longer (still capped). Transient
    error messages are appended to `errors` (provenance of the retries).

    A :class:`~voicebias.clients.endpoints.CircuitOpen` (nothing was sent: every
    endpoint's breaker is open) is no attempt: the call waits its `retry_after_s` and
    asks again; a final one (every breaker gave up) fails the request with its reason,
    which is appended to `gave_up` (the runner then sends nothing more for this system).
    `attempts` counts the tries that were sent.
    """
    attempt = 0
    while True:
        try:
            attempt += 1
            return system.call(request), attempt
        except SetupError:
            raise  # the system cannot run here at all: stop the stage with its message, record nothing
        except CircuitOpen as exc:
            attempt -= 1  # nothing was sent
            if exc.final:
                if gave_up is not None:
                    gave_up.append(str(exc))
                return S2SResponse.failed(str(exc)), attempt
            sleep(max(exc.retry_after_s if exc.retry_after_s is not None else PROBE_POLL_S, MIN_WAIT_S))
        except TransientError as exc:
            if errors is not None:
                errors.append(str(exc))
            if attempt >= policy.max_attempts:
                return S2SResponse.failed(f"transient error after {attempt} attempts: {exc}"), attempt
            sleep(_wait_s(policy, attempt, exc))
        except Exception as exc:  # one bad item must not kill the run
            return S2SResponse.failed(f"{type(exc).__name__}: {exc}"), attempt


def call_batch_with_retries(
    system: SystemUnderTest,
    requests: Sequence[Any],
    policy: RetryPolicy,
    sleep: Callable[[float], Any] = time.sleep,
    gave_up: list[str] | None = None,
) -> list[tuple[S2SResponse, int, list[str]]]:
    """Batch version: one (response, attempts, transient errors) per request.

    A batch that raises a transient error is retried whole with backoff; a batch
    that still fails, or fails otherwise, is retried item by item, so one bad
    input is recorded as failed without sinking the rest.
    """
    if len(requests) == 1:
        errs: list[str] = []
        resp, n = call_with_retries(system, requests[0], policy, sleep, errs, gave_up)
        return [(resp, n, errs)]
    errs = []
    for attempt in range(1, policy.max_attempts + 1):
        try:
            out = system.call_batch(list(requests))
            if len(out) != len(requests):
                raise RuntimeError(f"batch of {len(requests)} returned {len(out)} responses")
            return [(r, attempt, list(errs)) for r in out]
        except SetupError:
            raise
        except CircuitOpen:
            break  # nothing was sent; item by item, each waits for the breaker or fails with it
        except TransientError as exc:
            errs.append(f"batch: {exc}")
            if attempt == policy.max_attempts:
                break
            sleep(_wait_s(policy, attempt, exc))
        except Exception as exc:
            errs.append(f"batch: {type(exc).__name__}: {exc}")
            break
    results = []
    for req in requests:
        item_errs = list(errs)
        if gave_up:  # every breaker gave up on an earlier item: nothing more is sent
            results.append((S2SResponse.failed(gave_up[0]), 0, item_errs))
            continue
        resp, n = call_with_retries(system, req, policy, sleep, item_errs, gave_up)
        results.append((resp, n, item_errs))
    return results


class ResponseCache:
    """Content-addressed store of finished calls: <dir>/<key[:2]>/<key>/{response.json,audio.flac}.

    Transcripts made later by an ASR model are stored beside the entry, one JSON per
    ASR configuration, so changing the ASR never repeats a system call.

    An entry's record holds the sha256 of its audio file (`output_audio_sha256`). `get`
    serves an entry only when its audio is there and has that hash; an entry written
    before the hash was recorded is served when its audio decodes in full. Anything
    else (record not JSON, audio missing, truncated, replaced or undecodable) is a miss,
    counted in `corrupt`: the call is made again and its `put` replaces the entry.

    An entry is built in a private folder and moved into place with one rename, so a
    reader never sees half an entry; writers of one key at once (threads or processes)
    each move the entry in place whole, and the last one stays.
    """

    #: times `put` moves a concurrent writer's entry aside before it gives way to it
    _PUT_TRIES = 20

    def __init__(self, root: Path):
        self.root = Path(root)
        # an entry that cannot be read back is a miss (counted in .corrupt), replaced by the next put
        self.records = JsonCache(
            self.root,
            layout=lambda key: Path(key[:2], key, "response.json"),
            check=lambda v: isinstance(v, dict),
            indent=1,
        )
        self.transcripts = JsonCache(
            self.root,
            layout=lambda k: Path(k[0][:2], k[0], "asr", f"{k[1]}.json"),
            check=lambda v: isinstance(v, dict) and isinstance(v.get("text"), str),
        )
        #: the determinism probe's result per entry: the same request sent again, compared (probe_determinism)
        self.probes = JsonCache(
            self.root,
            layout=lambda key: Path(key[:2], key, "probe.json"),
            check=lambda v: isinstance(v, dict) and v.get("status") in ("ok", "failed"),
        )
        self.audio_corrupt = 0  # entries whose record reads but whose audio does not (missing, hash, decoding)
        self._lock = threading.Lock()

    @property
    def corrupt(self) -> int:
        return self.records.corrupt + self.transcripts.corrupt + self.audio_corrupt

    def _dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def _audio_intact(self, path: Path, sha256: Any) -> bool:
        """Whether the entry's audio file is the one stored: its recorded hash, or (no hash) it decodes."""
        from voicebias.audio import AudioError, read_audio

        try:
            if sha256 is not None:
                return sha256_file(path) == sha256
            read_audio(path)
        except (AudioError, OSError):
            return False
        return True

    def get(self, key: str) -> dict[str, Any] | None:
        record = self.records.get(key)
        if record is None:
            return None
        has_audio = record.get("output_audio_cached", record.get("status") == "ok")  # False: a reply without audio
        if has_audio and not self._audio_intact(self.audio_path(key), record.get("output_audio_sha256")):
            with self._lock:
                self.audio_corrupt += 1
            return None
        return record

    def put(self, key: str, record: dict[str, Any], response: S2SResponse) -> None:
        d = self._dir(key)
        tmp = d.with_name(f"{d.name}.tmp-{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True)
        record["output_audio_cached"] = False  # a reply without audio (or with no samples) has no file
        if response.audio is not None and np.asarray(response.audio).size:
            sr = int(response.sample_rate)
            if response.audio_flac is not None and flac_matches(response.audio_flac, response.audio, sr):
                (tmp / "audio.flac").write_bytes(response.audio_flac)  # the file write_audio writes, already made
            else:
                write_audio(tmp / "audio.flac", response.audio, sr)
            record["output_audio_cached"] = True
            record["output_audio_sha256"] = sha256_file(tmp / "audio.flac")
        atomic_write_json(tmp / "response.json", record, indent=1)
        self._move_in(tmp, d)

    def _move_in(self, tmp: Path, d: Path) -> None:
        """Rename the finished folder `tmp` to `d`, moving an existing `d` aside first.

        A rename is atomic, so `d` is always absent or a whole entry; when another writer
        puts its entry in place between the two renames, it is moved aside in turn."""
        for _ in range(self._PUT_TRIES):
            try:
                os.rename(tmp, d)
                return
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
            old = d.with_name(f"{d.name}.old-{uuid.uuid4().hex[:8]}")
            try:
                os.rename(d, old)
            except FileNotFoundError:
                continue  # another writer moved it aside already
            shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)  # the writers of this key kept replacing each other: one of them stays

    def audio_path(self, key: str) -> Path:
        return self._dir(key) / "audio.flac"

    def get_asr(self, key: str, asr_id: str) -> str | None:
        entry = self.transcripts.get((key, asr_id))
        return None if entry is None else entry["text"]

    def put_asr(self, key: str, asr_id: str, text: str) -> None:
        self.transcripts.put((key, asr_id), {"text": text})


def reply_audio_sha256(resp: S2SResponse) -> str | None:
    """The sha256 of the FLAC file the cache would store for this reply's audio (None: no audio)."""
    from voicebias.audio import flac_bytes

    if resp.audio is None or not np.asarray(resp.audio).size or not resp.sample_rate:
        return None
    sr = int(resp.sample_rate)
    data = (
        resp.audio_flac
        if resp.audio_flac is not None and flac_matches(resp.audio_flac, resp.audio, sr)
        else flac_bytes(resp.audio, sr)
    )
    return hashlib.sha256(data).hexdigest()


def probe_determinism(
    system: SystemUnderTest,
    requests: dict[str, Any],
    records: dict[str, dict[str, Any]],
    cache: ResponseCache,
    items: int,
    policy: RetryPolicy,
) -> dict[str, Any]:
    """Send the first `items` answered requests (by cache key) again and compare the replies with the
    cached ones: the transcript as text, the audio by the sha256 of its stored FLAC. An answered
    probe's result is kept in the cache beside its entry, so a later run reads it instead of sending again (and the
    tracked counts stay a function of the cache). Returns {items, failed, text_agree, audio_agree,
    agree, agreement} (agreement: the share of the answered probes whose text and audio both
    matched; None when no probe was answered). A probe that failed is counted as failed and
    not kept, so the next run sends it again."""
    keys = sorted(k for k, r in records.items() if r.get("status") == "ok")[: max(0, int(items))]
    results: dict[str, dict[str, Any]] = {}
    todo = []
    for key in keys:
        stored = cache.probes.get(key)
        if stored is not None:
            results[key] = stored
        else:
            todo.append(key)
    bs = max(1, int(system.batch_size))
    for i in range(0, len(todo), bs):
        batch = todo[i : i + bs]
        for key, (resp, _, _) in zip(batch, call_batch_with_retries(system, [requests[k] for k in batch], policy)):
            if resp.status != "ok":
                result = {"status": "failed", "error": resp.error or "failed"}
            else:
                before = records[key]
                result = {
                    "status": "ok",
                    "text_same": (resp.transcript or None) == (before.get("transcript") or None),
                    "audio_same": reply_audio_sha256(resp) == before.get("output_audio_sha256"),
                }
            if result["status"] == "ok":  # a failed probe is sent again next run, not kept
                cache.probes.put(key, result)
            results[key] = result
    ok = [r for r in results.values() if r["status"] == "ok"]
    agree = sum(1 for r in ok if r["text_same"] and r["audio_same"])
    return {
        "items": len(results),
        "failed": len(results) - len(ok),
        "text_agree": sum(1 for r in ok if r["text_same"]),
        "audio_agree": sum(1 for r in ok if r["audio_same"]),
        "agree": agree,
        "agreement": round(agree / len(ok), 4) if ok else None,
    }


def check_samples(samples: Any) -> int:
    """`samples` (answers per item) as an int, or a ValueError saying what it must be."""
    if isinstance(samples, bool) or not isinstance(samples, int):
        raise ValueError(f"samples per item must be a whole number, got {samples!r}")
    if samples < 1:
        raise ValueError(f"samples per item must be at least 1 (1 = one answer per item), got {samples}")
    return samples


def build_requests(
    system: SystemUnderTest,
    task: Task,
    stimuli: pd.DataFrame,
    seed: int,
    root: Path,
    continuation_s: float = 6.0,
    samples: int = 1,
) -> tuple[pd.DataFrame, list[S2SRequest | ContinuationRequest]]:
    """The stimuli this task runs on (sorted by id) and `samples` requests per stimulus, in
    (stimulus id, sample) order; sample s is seeded with sample_seed(seed, stimulus_id, s)."""
    check_samples(samples)
    langs = task.languages()
    todo = stimuli[stimuli["lang"].isin(langs)] if langs else stimuli
    todo = todo.sort_values("stimulus_id")
    draws = [(s, k) for s in todo.itertuples() for k in range(samples)]
    if system.kind == "continuation":
        requests: list[Any] = [
            ContinuationRequest(
                stimulus_id=s.stimulus_id,
                lang=s.lang,
                task=task.name,
                audio_path=str(root / s.path),
                audio_sha256=s.sha256,
                seed=sample_seed(seed, s.stimulus_id, k),
                continuation_s=float(continuation_s),
                prompt=task.prompts.get(s.lang, "") if task.prompts else "",
                sample=k,
            )
            for s, k in draws
        ]
    else:
        requests = [
            S2SRequest(
                stimulus_id=s.stimulus_id,
                lang=s.lang,
                target_lang=task.target_lang(s.lang),
                task=task.name,
                prompt=task.prompt(s.lang),
                audio_path=str(root / s.path),
                audio_sha256=s.sha256,
                seed=sample_seed(seed, s.stimulus_id, k),
                sample=k,
            )
            for s, k in draws
        ]
    return todo, requests


def output_audio_name(request: S2SRequest | ContinuationRequest) -> str:
    """File name of a request's output audio: <stimulus_id>.flac, <stimulus_id>.sample<s>.flac for a repeat s >= 1."""
    return f"{request.stimulus_id}.flac" if not request.sample else f"{request.stimulus_id}.sample{request.sample}.flac"


def run_task(
    system: SystemUnderTest,
    task: Task,
    stimuli: pd.DataFrame,
    out_dir: Path,
    cache: ResponseCache,
    seed: int,
    root: Path,
    policy: RetryPolicy | None = None,
    asr: Any | None = None,
    continuation_s: float = 6.0,
    progress: bool = True,
    samples: int = 1,
    check: Callable[[], Any] | None = None,
    screen: ReplyScreen | None = None,
    probe: int = 0,
) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Run `task` on every stimulus whose language the task covers, `samples` times each.

    Writes output audio to out_dir/audio/<stimulus_id>.flac (a repeat s >= 1:
    <stimulus_id>.sample<s>.flac) and returns the responses table (with a `sample`
    column when samples > 1, see the module docstring) plus counts: requests, calls (sent to the system), attempts
    (retries included), cache_hits, shared (requests answered by another request's
    identical call), failed, asr_calls, corrupt (cache entries found damaged, so called
    again: see ResponseCache), wall_s. `asr` (a :class:`voicebias.instruments.asr.WhisperASR`)
    transcribes outputs that come without text. `check` (default: the system's own
    :meth:`~voicebias.systems.base.SystemUnderTest.check`) runs once before the first call
    is sent, and not at all when every request is in the cache; a SetupError it raises
    stops the run before anything is sent.

    When every endpoint's circuit breaker has given up (see the module docstring), the
    requests not yet sent are recorded as failed with the breaker's reason, never sent.

    `screen` (default: ReplyScreen() with the default limits) excludes the replies the
    analyses cannot use (module docstring); they are counted in `excluded`.

    `probe` > 0 sends that many answered requests again once the run is done and compares the
    replies (`probe_determinism`); counts["determinism"] holds the result.

    An interruption (Ctrl-C, or any BaseException raised by the system) cancels the
    calls not yet started, lets the running ones finish into the cache, and re-raises.
    """
    t_start = time.perf_counter()
    policy = policy or RetryPolicy()
    audio_dir = out_dir / "audio"
    audio_dir.mkdir(parents=True, exist_ok=True)
    todo, requests = build_requests(system, task, stimuli, seed, root, continuation_s, samples)
    keys = [cache_key(system, r) for r in requests]
    counts: dict[str, Any] = {
        "requests": len(requests),
        "calls": 0,
        "attempts": 0,
        "cache_hits": 0,
        "shared": 0,
        "failed": 0,
        "excluded": 0,
        "asr_calls": 0,
    }
    screen = screen if screen is not None else ReplyScreen()
    input_s = (
        dict(zip(todo["stimulus_id"], pd.to_numeric(todo["duration_s"], errors="coerce")))
        if "duration_s" in todo.columns and system.kind == "s2s"
        else {}
    )
    corrupt_before = cache.corrupt  # entries of this run found damaged (called again): counts["corrupt"]
    lock = threading.Lock()

    def bump(name: str, n: int = 1) -> None:
        with lock:
            counts[name] += n

    records: dict[str, dict[str, Any]] = {}
    first: dict[str, S2SRequest | ContinuationRequest] = {}
    for key, req in zip(keys, requests):
        if key in first:
            bump("shared")
            continue
        first[key] = req
        rec = cache.get(key)
        if rec is not None and rec.get("status") == "ok":
            records[key] = rec
            bump("cache_hits")
    pending = [(k, r) for k, r in first.items() if k not in records]
    if pending:
        (check or system.check)()
    card_revision = str(system.card.get("revision", ""))

    def finish(
        key: str, req: Any, resp: S2SResponse, attempts: int, errs: list[str], started: str, latency: float
    ) -> None:
        record = {
            "status": resp.status,
            "transcript": resp.transcript,
            "error": resp.error,
            "model_revision": resp.provenance.get("model_revision") or card_revision,
            "latency_s": round(latency, 4),
            "attempts": attempts,
            "started_at": started,
            "finished_at": _now(),
            "request": asdict(req) | {"audio_path": None},
            "provenance": resp.provenance,
            "transient_errors": errs,
            "transcript_source": "system" if resp.transcript is not None else "none",
        }
        if resp.status == "ok" and resp.audio is not None and not resp.sample_rate:
            record.update(status="failed", error="system returned audio without a sample rate")
        elif resp.status == "ok":
            # a reply without audio, or with no samples, is a reply: cached as it came and
            # excluded by the screen when the table is built (asked again, it would select replies)
            record["output_frames"] = None if resp.audio is None else int(np.asarray(resp.audio).shape[0])
        elif resp.status not in ("ok", "failed"):
            record.update(status="failed", error=f"system returned unknown status {resp.status!r}")
        if record["status"] == "failed" and not record["error"]:
            record["error"] = "system reported a failure without a reason"
        if record["status"] == "ok":
            cache.put(key, record, resp)
        if attempts:  # a request the breaker never let out was not sent
            bump("calls")
            bump("attempts", attempts)
        with lock:
            records[key] = record

    gave_up: list[str] = []  # the breaker's reason, once every endpoint's breaker has given up

    def work(batch: list[tuple[str, Any]]) -> None:
        started = _now()
        t0 = time.perf_counter()
        if gave_up:  # nothing more is sent for this system
            results = [(S2SResponse.failed(gave_up[0]), 0, []) for _ in batch]
        else:
            results = call_batch_with_retries(system, [r for _, r in batch], policy, gave_up=gave_up)
        latency = (time.perf_counter() - t0) / len(batch)
        for (key, req), (resp, attempts, errs) in zip(batch, results):
            finish(key, req, resp, attempts, errs, started, latency)

    bs = max(1, int(system.batch_size))
    batches = [pending[i : i + bs] for i in range(0, len(pending), bs)]
    bar = tqdm(total=len(pending), desc=f"{system.name}/{task.name}", disable=not progress or not pending)
    pool = ThreadPoolExecutor(max_workers=max(1, int(system.max_concurrency)), thread_name_prefix=system.name)
    futures: dict[Future, int] = {pool.submit(work, b): len(b) for b in batches}
    try:
        remaining = set(futures)
        while remaining:
            done, remaining = wait(remaining, return_when=FIRST_COMPLETED)
            for f in done:
                f.result()  # a BaseException from a worker (interruption) surfaces here
                bar.update(futures[f])
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)  # running calls finish into the cache
        raise
    finally:
        bar.close()
    pool.shutdown(wait=True)

    if probe > 0 and not gave_up:
        counts["determinism"] = probe_determinism(system, first, records, cache, probe, policy)
    if asr is not None:
        _transcribe_missing(records, cache, asr, bump)

    audio_facts = _cached_audio_facts(
        [cache.audio_path(k) for k, r in records.items() if r["status"] == "ok" and r.get("output_audio_cached", True)]
    )
    rows = []
    for key, req in zip(keys, requests):
        record = records[key]
        row = {
            "system": system.name,
            "task": req.task,
            "stimulus_id": req.stimulus_id,
            SAMPLE: req.sample,
            "lang": req.lang,
            "target_lang": req.target_lang,
            "prompt": req.prompt,
            "cache_key": key,
            "adapter": str(system.card.get("adapter", "")),
            "provenance": json.dumps(
                {k: v for k, v in (record.get("provenance") or {}).items() if k not in DEPLOY_PROVENANCE},
                sort_keys=True,
                ensure_ascii=False,
                default=str,
            ),
            **{k: record.get(k) for k in ("transcript", "status", "error", "model_revision", "attempts")},
            "reason": CALL_FAILED if record.get("status") == "failed" else None,
            "transcript_source": record.get("transcript_source")
            or ("system" if record.get("transcript") is not None else "none"),
        }
        if record["status"] == "ok" and system.kind == "s2s" and record.get("transcript") is None:
            # the S2S analyses read transcripts: audio alone is not a usable answer (cached all the same,
            # so configuring an ASR later transcribes it without calling the system again)
            row.update(
                status="failed",
                reason=NO_TRANSCRIPT,
                error="the system returned audio without a transcript and no 'asr' "
                f"is configured in params.yaml systems.{system.name}",
            )
        row.update(output_audio=None, output_sha256=None, output_duration_s=None)
        if row["status"] == "ok":
            if record.get("output_audio_cached", True):
                dest = audio_dir / output_audio_name(req)
                shutil.copyfile(cache.audio_path(key), dest)
                digest, facts = audio_facts[str(cache.audio_path(key))]
                row.update(output_audio=str(dest.relative_to(root)), output_sha256=digest)
                if facts.get("frames") is not None:
                    row["output_duration_s"] = round(facts["frames"] / facts["sample_rate"], 4)
            else:
                facts = {"frames": record.get("output_frames")}
            verdict = screen(facts, row["transcript"], req.target_lang, input_s.get(req.stimulus_id))
            if verdict is not None:
                row.update(status="excluded", reason=verdict[0], error=verdict[1])
                counts["excluded"] += 1
        else:
            counts["failed"] += 1
        rows.append(row)
    columns = CONTINUATION_COLUMNS if "phonation" in todo.columns else RESPONSE_COLUMNS
    if samples > 1:
        columns = with_sample(columns)
    table = pd.DataFrame(rows, columns=[c for c in columns if c not in RESPONSE_STIMULUS_COLUMNS])
    meta_cols = [c for c in RESPONSE_STIMULUS_COLUMNS if c in todo.columns]
    table = table.join(todo.set_index("stimulus_id")[meta_cols], on="stimulus_id")
    for col in columns:
        if col not in table:
            table[col] = None
    counts["corrupt"] = cache.corrupt - corrupt_before
    counts["wall_s"] = round(time.perf_counter() - t_start, 3)
    return table[columns], counts


def _transcribe_missing(records: dict[str, dict[str, Any]], cache: ResponseCache, asr: Any, bump) -> None:
    """Fill transcripts of ok outputs that came without text, with the ASR (cached per ASR config).

    Outputs not in the cache are transcribed `asr.batch_size` at a time, grouped by language
    (`transcribe_many`); an ASR with only `transcribe` gets them one at a time."""
    from voicebias.audio import read_audio

    todo: list[str] = []
    for key, record in records.items():
        if record["status"] != "ok" or record.get("transcript") is not None:
            continue
        text = cache.get_asr(key, asr.cache_id)
        if text is None:
            todo.append(key)
            continue
        record["transcript"] = text
        record["transcript_source"] = f"asr:{asr.name}"

    def lang(key: str) -> str | None:
        return records[key].get("request", {}).get("lang")

    many = getattr(asr, "transcribe_many", None)
    step = max(1, int(getattr(asr, "batch_size", 1) or 1)) if many is not None else 1
    todo.sort(key=lambda k: str(lang(k) or ""))  # stable: one language per batch where possible
    for start in range(0, len(todo), step):
        part = todo[start : start + step]
        clips = [read_audio(cache.audio_path(k)) for k in part]
        if many is not None:
            texts = many([a for a, _ in clips], [sr for _, sr in clips], [lang(k) for k in part])
        else:
            texts = [asr.transcribe(clips[0][0], clips[0][1], language=lang(part[0]))]
        for key, text in zip(part, texts):
            cache.put_asr(key, asr.cache_id, text)
            bump("asr_calls")
            records[key]["transcript"] = text
            records[key]["transcript_source"] = f"asr:{asr.name}"


def _cached_audio_facts(paths: Sequence[Path]) -> dict[str, tuple[str, dict[str, Any]]]:
    """{path: (SHA-256 of the file, its reply facts)} for cached reply files. Files with the same
    bytes (the same answer from several tasks or systems) are decoded once, and the decoding runs
    on every core (libsndfile and NumPy release the GIL): the facts depend on the bytes only."""
    paths = list(dict.fromkeys(str(p) for p in paths))
    digests = dict(zip(paths, map(sha256_file, paths)))
    first = {d: p for p, d in reversed(digests.items())}  # one file per distinct content
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        facts = dict(zip(first, pool.map(file_facts, first.values())))
    return {p: (d, facts[d]) for p, d in digests.items()}


def validate_responses(table: pd.DataFrame, kind: str = "s2s", over: tuple[str, ...] = ()) -> ValidationReport:
    """Gate on the responses/transcripts table.

    Speech-to-speech rows that succeeded must carry a transcript; continuation rows
    may lack one (a system without a text stream and no ASR configured). A table with
    repeats (a `sample` column) has one row per stimulus x sample. `over`: the columns that tell
    apart several tables stacked into one to be checked at once (a stage's tasks, by `task`; the
    whole-run replicates, by `replicate` as well); a stimulus (and sample) is then unique within
    each combination of their values.
    """
    E = expectations()
    columns = CONTINUATION_COLUMNS if "phonation" in table.columns else RESPONSE_COLUMNS
    columns = list(dict.fromkeys([*columns, *over]))  # `over` may name a table column (task)
    if SAMPLE in table.columns:
        columns = with_sample(columns)
        unique = [
            E.ExpectCompoundColumnsToBeUnique(column_list=["stimulus_id", SAMPLE, *over]),
            E.ExpectColumnValuesToNotBeNull(column=SAMPLE),
            E.ExpectColumnValuesToBeBetween(column=SAMPLE, min_value=0),
        ]
    elif over:
        unique = [E.ExpectCompoundColumnsToBeUnique(column_list=["stimulus_id", *over])]
    else:
        unique = [E.ExpectColumnValuesToBeUnique(column="stimulus_id")]
    checks = [
        E.ExpectTableColumnsToMatchSet(column_set=columns, exact_match=True),
        *unique,
        E.ExpectColumnValuesToBeInSet(column="status", value_set=list(RESPONSE_STATUSES)),
        E.ExpectColumnValuesToBeInSet(column="lang", value_set=list(LANGUAGES)),
        E.ExpectColumnValuesToBeInSet(column="voice_gender", value_set=list(GENDERS)),
        E.ExpectColumnValuesToNotBeNull(column="output_audio", row_condition=where("status", "ok")),
        E.ExpectColumnValuesToNotBeNull(column="error", row_condition=where("status", "failed")),
        E.ExpectColumnValuesToNotBeNull(column="error", row_condition=where("status", "excluded")),
        E.ExpectColumnValuesToNotBeNull(column="reason", row_condition=where("status", "excluded")),
        E.ExpectColumnValuesToNotBeNull(column="reason", row_condition=where("status", "failed")),
        E.ExpectColumnValuesToBeInSet(column="reason", value_set=[*REPLY_REASONS, CALL_FAILED, NO_TRANSCRIPT]),
        E.ExpectColumnValuesToNotBeNull(column="prompt"),
        E.ExpectColumnValuesToNotBeNull(column="cache_key"),
        E.ExpectColumnValuesToNotBeNull(column="attempts", row_condition=where("status", "ok")),
    ]
    if kind == "s2s":
        checks.append(E.ExpectColumnValuesToNotBeNull(column="transcript", row_condition=where("status", "ok")))
    return require_valid(table, "responses", checks)


def build_asr(sys_params: dict[str, Any], root: Path) -> Any | None:
    """The Whisper ASR named by the system's `asr` params, or None (see voicebias.instruments.asr)."""
    spec = sys_params.get("asr")
    if not spec:
        return None
    from voicebias.instruments.asr import WhisperASR
    from voicebias.io import resolve_path

    spec = {"model": spec} if isinstance(spec, str) else dict(spec)
    model = spec.pop("model", None)
    if not model:
        raise ConfigError("the system's 'asr' params need 'model' (a local Whisper folder)")
    return WhisperASR(resolve_path(model, root), **spec)
