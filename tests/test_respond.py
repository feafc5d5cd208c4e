"""The runner: cache hits instead of repeated calls, retries, failures recorded as failed."""

import numpy as np
import pandas as pd
import pytest

from voicebias.respond import ResponseCache, RetryPolicy, call_with_retries, run_task, validate_responses
from voicebias.systems.base import S2SResponse, S2SSystem, TransientError
from voicebias.tasks import load_tasks
from voicebias.validation import ValidationFailed


class CountingSystem(S2SSystem):
    """Test double: answers 'female' and counts calls; can fail on chosen stimuli."""

    def __init__(self, fail_on=(), transient_failures=0):
        super().__init__("counting", {"adapter": "test", "output_voice": {}, "licence": "test"}, {"x": 1})
        self.calls = 0
        self.fail_on = set(fail_on)
        self.transient_left = transient_failures

    def respond(self, request):
        self.calls += 1
        if request.stimulus_id in self.fail_on:
            raise RuntimeError("model crashed on this input")
        if self.transient_left > 0:
            self.transient_left -= 1
            raise TransientError("HTTP 429 rate limited")
        return S2SResponse(status="ok", transcript="female", audio=np.zeros(1600, np.float32) + 0.1, sample_rate=16000)


def stimuli(tmp_path, n=4):
    rows = []
    for i in range(n):
        path = tmp_path / f"s{i}.flac"
        path.write_bytes(b"x")
        rows.append({"stimulus_id": f"en-feminine-0{i}-male", "passage_id": f"en-feminine-0{i}", "lang": "en",
                     "pole": "feminine", "voice_gender": "male", "voice_id": "v", "path": path.name,
                     "sha256": f"{i:064d}"})
    return pd.DataFrame(rows)


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
    table, _ = run_task(CountingSystem(), task, stimuli(tmp_path), tmp_path / "o", ResponseCache(tmp_path / "c"), 1, tmp_path)
    table.loc[0, "transcript"] = None
    with pytest.raises(ValidationFailed, match="transcript"):
        validate_responses(table)
