"""The runner: cache hits instead of repeated calls, resume after interruption, retries, batching,
failures recorded as failed."""

import json

import numpy as np
import pandas as pd
import pytest

from tests.support.systems import CountingSystem, stimuli
from voicebias.errors import SetupError, TransientError
from voicebias.systems.base import S2SResponse, S2SSystem
from voicebias.systems.runner import ResponseCache, RetryPolicy, call_with_retries, run_task, validate_responses
from voicebias.tasks import load_tasks
from voicebias.validation import ValidationFailed


def test_second_run_makes_no_calls(tmp_path):
    task = load_tasks()["describe"]
    cache = ResponseCache(tmp_path / "cache")
    system = CountingSystem()
    table1, c1 = run_task(system, task, stimuli(tmp_path), tmp_path / "out1", cache, 1, tmp_path)
    table2, c2 = run_task(system, task, stimuli(tmp_path), tmp_path / "out2", cache, 1, tmp_path)
    assert c1["calls"] == 4 and c1["cache_hits"] == 0
    assert c2["calls"] == 0 and c2["cache_hits"] == 4 and system.calls == 4
    # a resumed stage reproduces the same table, provenance included
    assert table1.drop(columns=["output_audio"]).equals(table2.drop(columns=["output_audio"]))
    validate_responses(table1)


def test_seed_is_part_of_the_cache_key(tmp_path):
    task = load_tasks()["describe"]
    cache = ResponseCache(tmp_path / "cache")
    system = CountingSystem()
    run_task(system, task, stimuli(tmp_path), tmp_path / "o", cache, 1, tmp_path)
    run_task(system, task, stimuli(tmp_path), tmp_path / "o2", cache, 2, tmp_path)
    assert system.calls == 8


def test_failures_are_recorded_not_invented_and_retried_next_time(tmp_path):
    task = load_tasks()["describe"]
    cache = ResponseCache(tmp_path / "cache")
    bad = "en-feminine-01-male"
    system = CountingSystem(fail_on={bad})
    table, counts = run_task(system, task, stimuli(tmp_path), tmp_path / "o", cache, 1, tmp_path)
    row = table.set_index("stimulus_id").loc[bad]
    assert row["status"] == "failed" and "model crashed" in row["error"]
    assert pd.isna(row["transcript"]) and pd.isna(row["output_audio"])
    assert counts["failed"] == 1 and (table["status"] == "ok").sum() == 3
    validate_responses(table)
    system.fail_on.clear()
    table2, counts2 = run_task(system, task, stimuli(tmp_path), tmp_path / "o2", cache, 1, tmp_path)
    assert counts2["calls"] == 1 and counts2["cache_hits"] == 3 and (table2["status"] == "ok").all()


def test_transient_errors_retry_with_backoff():
    sleeps = []
    system = CountingSystem(transient_failures=2)
    req = type("R", (), {"stimulus_id": "a"})()
    resp, attempts = call_with_retries(system, req, RetryPolicy(max_attempts=4, base_delay_s=1.0), sleep=sleeps.append)
    assert resp.status == "ok" and attempts == 3 and sleeps == [1.0, 2.0]
    system = CountingSystem(transient_failures=10)
    resp, attempts = call_with_retries(system, req, RetryPolicy(max_attempts=3, base_delay_s=0.5), sleep=sleeps.append)
    assert resp.status == "failed" and attempts == 3 and "429" in resp.error


def test_responses_gate_rejects_ok_rows_without_transcript(tmp_path):
    task = load_tasks()["describe"]
    table, _ = run_task(
        CountingSystem(), task, stimuli(tmp_path), tmp_path / "o", ResponseCache(tmp_path / "c"), 1, tmp_path
    )
    table.loc[0, "transcript"] = None
    with pytest.raises(ValidationFailed, match="transcript"):
        validate_responses(table)


# ---------------------------------------------------------------------------
# interruption and resume


class Interrupted(BaseException):
    """Stands in for Ctrl-C / a crash: not an Exception, so the runner must not record it as a failure."""


class InterruptingSystem(CountingSystem):
    """Counts calls and the stimuli answered; raises Interrupted on call number `stop_at`."""

    max_concurrency = 3

    def __init__(self, stop_at=None):
        super().__init__()
        self.stop_at = stop_at
        self.answered = []
        import threading

        self._lock = threading.Lock()

    def respond(self, request):
        with self._lock:
            self.calls += 1
            n = self.calls
        if self.stop_at is not None and n == self.stop_at:
            raise Interrupted()
        import time

        time.sleep(0.01)
        with self._lock:
            self.answered.append(request.stimulus_id)
        return S2SResponse(status="ok", transcript="female", audio=np.zeros(1600, np.float32) + 0.1, sample_rate=16000)


def test_interrupted_run_resumes_without_repeating_a_finished_call(tmp_path):
    task = load_tasks()["describe"]
    cache = ResponseCache(tmp_path / "cache")
    stim = stimuli(tmp_path, n=10)
    first = InterruptingSystem(stop_at=5)
    with pytest.raises(Interrupted):
        run_task(first, task, stim, tmp_path / "o1", cache, 1, tmp_path, progress=False)
    # calls not yet started were cancelled; running ones finished into the cache
    assert 4 <= len(first.answered) < 10
    second = InterruptingSystem()
    table, counts = run_task(second, task, stim, tmp_path / "o2", cache, 1, tmp_path, progress=False)
    assert not set(first.answered) & set(second.answered)  # zero repeated calls
    assert counts["cache_hits"] == len(first.answered) and counts["calls"] == 10 - len(first.answered)
    assert sorted(first.answered + second.answered) == sorted(stim["stimulus_id"])
    assert (table["status"] == "ok").all()


def test_identical_requests_are_sent_once(tmp_path):
    task = load_tasks()["describe"]
    stim = stimuli(tmp_path, n=3)
    stim.loc[2, "sha256"] = stim.loc[1, "sha256"]  # same audio: same cache key
    system = CountingSystem()
    table, counts = run_task(
        system, task, stim, tmp_path / "o", ResponseCache(tmp_path / "c"), 1, tmp_path, progress=False
    )
    assert system.calls == 2 and counts["shared"] == 1 and len(table) == 3
    assert table["cache_key"].iloc[1] == table["cache_key"].iloc[2]


def test_batching_hook_gets_batches_and_isolates_a_bad_item(tmp_path):
    class Batched(CountingSystem):
        batch_size = 4

        def __init__(self):
            super().__init__(fail_on={"en-feminine-02-male"})
            self.batches = []

        def call_batch(self, requests):
            self.batches.append([r.stimulus_id for r in requests])
            return [self.call(r) for r in requests]

    system = Batched()
    table, counts = run_task(
        system,
        load_tasks()["describe"],
        stimuli(tmp_path, n=6),
        tmp_path / "o",
        ResponseCache(tmp_path / "c"),
        1,
        tmp_path,
        progress=False,
    )
    assert [len(b) for b in system.batches] == [4, 2]
    # the batch holding the bad input raised; its items were retried one by one
    by_id = table.set_index("stimulus_id")
    assert by_id.loc["en-feminine-02-male", "status"] == "failed"
    assert (table["status"] == "ok").sum() == 5 and counts["failed"] == 1


def test_runner_knobs_do_not_change_the_cache_key(tmp_path):
    from voicebias.systems.base import S2SRequest
    from voicebias.systems.runner import cache_key

    req = S2SRequest("a", "en", "en", "describe", "p", "x", "0" * 64, 1)
    a, b = CountingSystem(), CountingSystem()
    b.params = {"x": 1, "max_concurrency": 8, "timeout_s": 3, "retry": {"max_attempts": 9}, "base_url": "http://h"}
    assert cache_key(a, req) == cache_key(b, req)
    b.params = {"x": 2}
    assert cache_key(a, req) != cache_key(b, req)


def test_killed_respond_stage_resumes_with_zero_repeated_calls(tmp_path):
    """Kill `python -m stages.respond` (SIGKILL) midway, run it again, count calls on the server."""
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    import yaml

    from tests.fakes.openai_server import FakeOpenAIAudioServer, fingerprint_file
    from tests.fakes.stimuli import make_stimuli
    from voicebias import config

    repo = config.ROOT
    root = tmp_path / "proj"
    key = "sk-test-resume-0123456789abcdef"
    stim = make_stimuli(root, 30)
    stim.to_csv(root / "data" / "stimuli" / "manifest.csv", index=False)
    (root / "data" / "passages").mkdir(parents=True)
    pd.DataFrame({"passage_id": stim["passage_id"]}).to_csv(root / "data" / "passages" / "passages.csv", index=False)
    (root / "reports" / "carrier_gate").mkdir(parents=True)
    (root / "reports" / "carrier_gate" / "metrics.json").write_text('{"passed": true}')
    shutil.copytree(config.TASKS_DIR, root / "data" / "tasks")
    (root / "models" / "cards").mkdir(parents=True)
    shutil.copy(config.CARDS_DIR / "gpt_audio.yaml", root / "models" / "cards")
    (root / "dvc.yaml").write_text("stages: {}\n")
    with FakeOpenAIAudioServer(key, latency_s=0.08) as server:
        params = yaml.safe_load((config.PROFILES_DIR / "embedded.yaml").read_text(encoding="utf-8"))
        params["base"]["seed"] = 3
        # no determinism probe: this test counts the calls a resumed run repeats (the probe re-sends
        # some by design; tests/unit/pipeline/test_failure_policy.py checks it through the stage)
        params["run"] = {"systems": ["gpt_audio"], "sc_systems": [], "determinism_probe": 0}
        params["systems"] = {
            "gpt_audio": {
                "model": "gpt-4o-audio-preview",
                "base_url": server.base_url,
                "max_concurrency": 2,
                "timeout_s": 10,
            }
        }
        (root / "params.yaml").write_text(yaml.safe_dump(params))
        env = {
            **os.environ,
            "VOICEBIAS_ROOT": str(root),
            "VOICEBIAS_CACHE": str(root / ".cache"),
            "OPENAI_API_KEY": key,
            "PYTHONPATH": str(repo),
        }
        cmd = [sys.executable, "-m", "stages.respond", "--system", "gpt_audio", "--task", "describe"]
        proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        while sum(server.delivered().values()) < 10 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        first_run = server.delivered()
        assert 10 <= sum(first_run.values()) < 30, "the stage was not killed midway"
        cache_dir = root / ".cache" / "responses"
        cached = {p.name for p in cache_dir.glob("*/*") if (p / "response.json").exists()}
        assert len(cached) >= sum(first_run.values()) - 2  # at most the 2 in-flight replies were lost
        server.wait_idle()  # requests of the killed run are logged before the re-run starts
        n_log = len(server.log)
        done = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        second_run = [e.fingerprint for e in server.log[n_log:]]
    stats = json.loads((root / "reports" / "respond" / "gpt_audio" / "describe.json").read_text())
    # this run's call counts are in the run log, not in the tracked stage metrics
    assert set(stats) == {"requests", "shared", "failed", "excluded"} and stats["requests"] == 30
    assert stats["failed"] == stats["excluded"] == 0
    from voicebias.runlog import latest

    stats = latest(root / "logs" / "runs.jsonl")["respond@gpt_audio-describe"]
    table = pd.read_csv(root / "data" / "responses" / "gpt_audio" / "describe" / "responses.csv")
    cached_fps = {
        fingerprint_file(root / p)
        for p, k in zip(stim["path"], table.set_index("stimulus_id").loc[stim["stimulus_id"], "cache_key"])
        if k in cached
    }
    assert not cached_fps & set(second_run)  # zero repeated calls for finished calls
    assert stats["cache_hits"] == len(cached) and stats["calls"] == 30 - len(cached) == len(second_run)
    assert (table["status"] == "ok").all() and len(table) == 30
    assert "cache hits" in done.stderr  # reported to the user as well


def test_the_response_cache_keeps_a_systems_flac_only_where_it_fits_the_audio(tmp_path):
    """A system that already has the FLAC file of its audio (a kept render) hands it over and the
    cache stores those bytes without encoding; bytes whose header does not fit the audio (other
    length or rate, not FLAC) are not taken, the audio is encoded as without them."""
    from voicebias.audio import flac_bytes

    x = np.random.default_rng(1).uniform(-1, 1, 3000).astype(np.float32)
    cache = ResponseCache(tmp_path)
    for key, given in (("a", flac_bytes(x, 16000)), ("b", flac_bytes(0.5 * x, 16000))):
        cache.put(key * 64, {"status": "ok"}, S2SResponse("ok", "t", x, 16000, audio_flac=given))
        assert cache.audio_path(key * 64).read_bytes() == given  # taken as they are
    for key, given in (("c", flac_bytes(x[:-10], 16000)), ("d", flac_bytes(x, 22050)), ("e", b"RIFF....")):
        cache.put(key * 64, {"status": "ok"}, S2SResponse("ok", "t", x, 16000, audio_flac=given))
        assert cache.audio_path(key * 64).read_bytes() == flac_bytes(x, 16000)  # encoded afresh
    assert all(cache.get(k * 64)["output_audio_cached"] for k in "abcde")


# ---------------------------------------------------------------------------
# the pre-run check and the circuit breaker


def test_the_check_runs_once_before_the_first_call_and_not_when_everything_is_cached(tmp_path):
    class Checked(CountingSystem):
        def __init__(self, refuse=False):
            super().__init__()
            self.checks, self.refuse = [], refuse

        def check(self):
            self.checks.append(self.calls)  # how many calls were made before it
            if self.refuse:
                raise SetupError("system 'counting': cannot reach http://h:1/v1 (connection refused)")

    task = load_tasks()["describe"]
    cache = ResponseCache(tmp_path / "cache")
    refused = Checked(refuse=True)
    with pytest.raises(SetupError, match="connection refused"):
        run_task(refused, task, stimuli(tmp_path), tmp_path / "o0", cache, 1, tmp_path, progress=False)
    assert refused.checks == [0] and refused.calls == 0 and not list(cache.root.glob("*/*"))
    system = Checked()
    run_task(system, task, stimuli(tmp_path), tmp_path / "o1", cache, 1, tmp_path, progress=False)
    assert system.checks == [0] and system.calls == 4
    run_task(system, task, stimuli(tmp_path), tmp_path / "o2", cache, 1, tmp_path, progress=False)
    assert system.checks == [0]  # every call cached: nothing to check, e.g. an offline re-run


class BreakerSystem(S2SSystem):
    """Test double in front of a real EndpointPool whose one endpoint never answers (or answers from
    call number `heal_at` on): counts what reached the endpoint."""

    def __init__(self, breaker, heal_at=None, concurrency=1):
        super().__init__(
            "breaking", {"adapter": "test", "output_voice": {}, "licence": "test"}, {"max_concurrency": concurrency}
        )
        from voicebias.clients.endpoints import Endpoint, EndpointPool

        self.pool = EndpointPool(
            [Endpoint("http://h:1/v1", max_concurrency=concurrency)],
            name="breaking",
            breaker=breaker,
            report=lambda line: None,
        )
        self.sent, self.heal_at = 0, heal_at
        import threading

        self._lock = threading.Lock()

    def once(self, i):
        from voicebias.clients.endpoints import Unreachable

        with self._lock:
            self.sent += 1
            n = self.sent
        if self.heal_at is not None and n >= self.heal_at:
            return "up"
        raise Unreachable("connection refused")

    def respond(self, request):
        from voicebias.clients.endpoints import AllEndpointsDown

        try:
            self.pool.call(self.once)
        except AllEndpointsDown as exc:
            raise TransientError(str(exc), retry_after_s=exc.retry_after_s) from exc
        return S2SResponse(status="ok", transcript="female", audio=np.zeros(1600, np.float32) + 0.1, sample_rate=16000)


def test_when_the_breaker_gives_up_the_remaining_requests_are_failed_unsent(tmp_path):
    from voicebias.clients.endpoints import Breaker

    system = BreakerSystem(Breaker(failures=3, cooldown_s=0.01, max_cooldown_s=0.02, max_reopens=2))
    policy = RetryPolicy(max_attempts=2, base_delay_s=0.0, max_delay_s=0.0)
    table, counts = run_task(
        system,
        load_tasks()["describe"],
        stimuli(tmp_path, n=40),
        tmp_path / "o",
        ResponseCache(tmp_path / "c"),
        1,
        tmp_path,
        policy=policy,
        progress=False,
    )
    # 3 failures open it, 2 probes fail: then nothing more is sent for 40 requests x 2 attempts
    assert system.sent == 5
    reason = "circuit open after 5 consecutive failures (re-opened 2 times, given up for this run): connection refused"
    assert (table.status == "failed").all() and (table.error == reason).sum() == 38
    # the two requests that reached the endpoint first spent their attempts on it
    assert set(table.error) <= {reason, "transient error after 2 attempts: connection refused"}
    assert counts["failed"] == 40 and counts["calls"] == (table.attempts > 0).sum() <= 5
    assert table.transcript.isna().all() and table.output_audio.isna().all()


def test_a_call_waits_while_the_breaker_is_open_without_spending_attempts():
    from voicebias.clients.endpoints import CircuitOpen

    class Opening(CountingSystem):
        def __init__(self, raises):
            super().__init__()
            self.raises = list(raises)

        def respond(self, request):
            if self.raises:
                raise self.raises.pop(0)
            return super().respond(request)

    sleeps, errors, gave_up = [], [], []
    req = type("R", (), {"stimulus_id": "a"})()
    system = Opening(
        [
            CircuitOpen("circuit open after 5 consecutive failures: timeout after 1 s", 7.5, final=False),
            CircuitOpen("...", None, final=False),
            TransientError("HTTP 503"),
        ]
    )
    resp, attempts = call_with_retries(
        system, req, RetryPolicy(max_attempts=2, base_delay_s=1.0), sleep=sleeps.append, errors=errors, gave_up=gave_up
    )
    # two waits for the breaker (its hint, then the probe poll), one backoff; the 503 and the answer are the attempts
    from voicebias.clients.endpoints import PROBE_POLL_S

    assert resp.status == "ok" and attempts == 2 and sleeps == [7.5, PROBE_POLL_S, 1.0]
    assert errors == ["HTTP 503"] and gave_up == []
    final = CircuitOpen(
        "circuit open after 9 consecutive failures (re-opened 3 times, given up for this run): timeout after 1 s",
        None,
        final=True,
    )
    resp, attempts = call_with_retries(
        Opening([TransientError("HTTP 503"), final]),
        req,
        RetryPolicy(max_attempts=4, base_delay_s=0.0),
        sleep=sleeps.append,
        gave_up=gave_up,
    )
    assert resp.status == "failed" and resp.error == str(final) and attempts == 1 and gave_up == [str(final)]


def test_a_breaker_that_closes_again_lets_the_run_finish(tmp_path):
    from voicebias.clients.endpoints import Breaker

    # the endpoint is back from the 5th send on: the second probe finds it
    system = BreakerSystem(Breaker(failures=3, cooldown_s=0.01, max_cooldown_s=0.02, max_reopens=3), heal_at=5)
    table, counts = run_task(
        system,
        load_tasks()["describe"],
        stimuli(tmp_path, n=12),
        tmp_path / "o",
        ResponseCache(tmp_path / "c"),
        1,
        tmp_path,
        policy=RetryPolicy(max_attempts=3, base_delay_s=0.0, max_delay_s=0.0),
        progress=False,
    )
    # the first request spent its three attempts on the dead endpoint; those queued behind the open
    # breaker waited (no attempt spent) and were answered once the probe found the endpoint back
    assert table.status.tolist() == ["failed"] + ["ok"] * 11 and counts["failed"] == 1
    assert table.error.iloc[0] == "transient error after 3 attempts: connection refused"
    # the second request carried the first probe (failed) and the second (answered)
    assert system.sent == 3 + 1 + 11 and table.attempts.tolist() == [3, 2] + [1] * 10
    assert system.pool.stats()[0]["breaker"] == "closed" and system.pool.stats()[0]["opens"] == 1
