"""One system's requests sharded across several endpoints, end to end through the runner against
fake OpenAI audio servers on loopback (the real protocol, a fixed latency per request).

What users rely on: with several endpoints every request is answered exactly once, even
when an endpoint dies mid-run; none is lost or filled in; the responses table and the
audio files are byte-identical to a one-endpoint run; no endpoint holds more requests
than its max_concurrency; and weights steer the shares (the speed-up with more endpoints
is measured by benchmarks/bench_endpoints.py).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.fakes.openai_server import FakeOpenAIAudioServer, fingerprint_file
from tests.fakes.stimuli import make_stimuli
from voicebias.io import write_table
from voicebias.params import ParamsError
from voicebias.systems import build_system, load_card
from voicebias.systems.base import S2SRequest
from voicebias.systems.runner import ResponseCache, RetryPolicy, cache_key, run_task, validate_responses
from voicebias.tasks import load_tasks

OUT = Path("data") / "responses" / "served" / "describe"


@pytest.fixture(autouse=True)
def no_endpoints_file(tmp_path, monkeypatch):
    """Keep a developer's own .cache/endpoints.json out of these tests."""
    monkeypatch.setenv("VOICEBIAS_ENDPOINTS", str(tmp_path / "no-endpoints.json"))


@pytest.fixture
def cards(tmp_path):
    d = tmp_path / "cards"
    d.mkdir()
    card = load_card("gpt_audio") | {"adapter": "openai_compatible", "checkpoint": "Qwen/Qwen2.5-Omni-7B"}
    (d / "served.yaml").write_text(json.dumps(card))
    return d


def served(cards, root, **params):
    return build_system("served", {"voice": "Chelsie", "timeout_s": 10.0, **params}, cards_dir=cards, root=root)


def shards(servers, caps, weights=None):
    weights = weights or [1] * len(servers)
    return [{"url": s.base_url, "weight": w, "max_concurrency": c} for s, c, w in zip(servers, caps, weights)]


def run(system, stim, root, cache_dir, policy=None):
    """Run the describe task the way the respond stage does; (table, counts, wall s, output bytes by path)."""
    out = root / OUT
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    table, counts = run_task(system, load_tasks()["describe"], stim, out, ResponseCache(cache_dir), 1, root,
                             policy=policy, progress=False)
    wall = time.perf_counter() - t0
    write_table(out / "responses.csv", table)
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    return table, counts, wall, files


def answered_once(servers, fps):
    """Every input delivered exactly once, summed over the servers."""
    total = Counter()
    for s in servers:
        s.wait_idle()  # a reply is logged just after it is sent
        total.update(s.delivered())
    assert dict(total) == {fp: 1 for fp in fps}


def requests_per_server(servers):
    for s in servers:
        s.wait_idle()
    return [len(s.log) for s in servers]


def test_three_endpoints_answer_once_byte_identical_and_bounded(tmp_path, cards):
    n, latency = 36, 0.05
    stim = make_stimuli(tmp_path, n)
    fps = [fingerprint_file(tmp_path / p) for p in stim["path"]]
    with FakeOpenAIAudioServer("EMPTY", latency_s=latency) as one:
        system = served(cards, tmp_path, base_url=one.base_url, max_concurrency=2)
        table1, counts1, wall1, files1 = run(system, stim, tmp_path, tmp_path / "cache1")
        system.close()
    answered_once([one], fps)
    assert one.max_in_flight <= 2

    with FakeOpenAIAudioServer("EMPTY", latency_s=latency) as a, \
            FakeOpenAIAudioServer("EMPTY", latency_s=latency) as b, \
            FakeOpenAIAudioServer("EMPTY", latency_s=latency) as c:
        system = served(cards, tmp_path, endpoints=shards([a, b, c], [2, 2, 2]))
        assert system.max_concurrency == 6  # the runner's threads: the sum of the endpoints' capacities
        table3, counts3, wall3, files3 = run(system, stim, tmp_path, tmp_path / "cache3")
        facts = system.run_facts()
        system.close()
    answered_once([a, b, c], fps)
    assert max(a.max_in_flight, b.max_in_flight, c.max_in_flight) <= 2
    assert all(e["max_in_flight"] <= 2 and e["answered"] > 0 for e in facts["endpoints"])

    assert (table3.status == "ok").all() and counts3["calls"] == n and counts3["failed"] == 0
    validate_responses(table3)
    assert table3["stimulus_id"].tolist() == sorted(stim["stimulus_id"])  # rows in item order
    # the stage's outputs do not depend on the number of endpoints or the order calls finished in
    assert sorted(files3) == sorted(files1) and len(files1) == n + 1
    for name in files1:
        assert files3[name] == files1[name], name
    assert "127.0.0.1" not in files3["responses.csv"].decode()  # no endpoint address in a tracked output
    # the speed-up with more endpoints is measured in benchmarks/bench_endpoints.py, not here


def test_an_endpoint_killed_mid_run_loses_nothing_and_changes_no_byte(tmp_path, cards):
    n = 30
    stim = make_stimuli(tmp_path, n)
    fps = [fingerprint_file(tmp_path / p) for p in stim["path"]]
    with FakeOpenAIAudioServer("EMPTY") as one:
        system = served(cards, tmp_path, base_url=one.base_url, max_concurrency=4)
        table1, _, _, files1 = run(system, stim, tmp_path, tmp_path / "cache1")
        system.close()

    with FakeOpenAIAudioServer("EMPTY", latency_s=0.05) as a, \
            FakeOpenAIAudioServer("EMPTY", latency_s=0.05) as victim, \
            FakeOpenAIAudioServer("EMPTY", latency_s=0.05) as c:
        def kill_after_a_few():
            deadline = time.perf_counter() + 20
            while sum(victim.delivered().values()) < 3 and time.perf_counter() < deadline:
                time.sleep(0.002)
            victim.kill()

        killer = threading.Thread(target=kill_after_a_few)
        killer.start()
        system = served(cards, tmp_path, endpoints=shards([a, victim, c], [2, 2, 2]))
        table3, counts3, _, files3 = run(system, stim, tmp_path, tmp_path / "cache3")
        killer.join()
        facts = {e["endpoint"]: e for e in system.run_facts()["endpoints"]}
        system.close()

    dead = facts[victim.base_url]
    victim.wait_idle()
    assert 3 <= sum(victim.delivered().values()) < n and dead["unreachable"] >= 1, "not killed mid-run"
    # every request answered exactly once over the three servers; none lost, none failed
    answered_once([a, victim, c], fps)
    assert (table3.status == "ok").all() and counts3["failed"] == 0 and counts3["calls"] == n
    assert sum(e["answered"] for e in facts.values()) == n
    assert (table3["attempts"] == 1).all()  # moved to another endpoint within the call, not retried later
    assert max(a.max_in_flight, victim.max_in_flight, c.max_in_flight) <= 2
    for name in files1:
        assert files3[name] == files1[name], name
    assert sorted(files3) == sorted(files1)


def test_weights_set_the_shares(tmp_path, cards):
    stim = make_stimuli(tmp_path, 32)
    task = load_tasks()["describe"]
    with FakeOpenAIAudioServer("EMPTY") as a, FakeOpenAIAudioServer("EMPTY") as b, \
            FakeOpenAIAudioServer("EMPTY") as c:
        # one request at a time (spare capacity everywhere): the shares are the weights'
        system = served(cards, tmp_path, endpoints=shards([a, b, c], [2, 2, 2], weights=[3, 2, 1]))
        for s in stim.itertuples():
            req = S2SRequest(s.stimulus_id, "en", "en", "describe", task.prompt("en"), str(tmp_path / s.path),
                             s.sha256, 1)
            assert system.respond(req).status == "ok"
        system.close()
        shares = requests_per_server([a, b, c])
    assert shares == [16, 11, 5]  # 3:2:1 of 32, the round-robin's exact order

    with FakeOpenAIAudioServer("EMPTY", latency_s=0.05) as a, FakeOpenAIAudioServer("EMPTY", latency_s=0.05) as b, \
            FakeOpenAIAudioServer("EMPTY", latency_s=0.05) as c:
        # under full load (the runner keeps every slot busy) each endpoint's share follows its capacity:
        # weights in proportion to capacity keep both in step
        system = served(cards, tmp_path, endpoints=shards([a, b, c], [4, 2, 2], weights=[2, 1, 1]))
        table, _, _, _ = run(system, stim, tmp_path, tmp_path / "cache")
        system.close()
        shares = [k / len(stim) for k in requests_per_server([a, b, c])]
    assert (table.status == "ok").all()
    assert shares == pytest.approx([0.5, 0.25, 0.25], abs=0.13), shares


def test_every_endpoint_down_is_a_recorded_failure_never_an_answer(tmp_path, cards):
    stim = make_stimuli(tmp_path, 3)
    with FakeOpenAIAudioServer("EMPTY") as a, FakeOpenAIAudioServer("EMPTY") as b:
        a.kill()
        b.kill()
        system = served(cards, tmp_path, endpoints=shards([a, b], [2, 2]))
        table, counts, _, files = run(system, stim, tmp_path, tmp_path / "cache",
                                      policy=RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.02))
        system.close()
    assert (table.status == "failed").all() and counts["failed"] == 3
    assert table.error.str.startswith("transient error after 2 attempts: every endpoint is down (2 endpoints").all()
    assert table.transcript.isna().all() and table.output_audio.isna().all()
    assert list(files) == ["responses.csv"]
    assert not any(ResponseCache(tmp_path / "cache").root.glob("*/*"))  # nothing cached: tried again next run


def test_endpoints_are_no_part_of_the_cache_key_and_stay_in_the_cache_entry(tmp_path, cards):
    req = S2SRequest("en-masculine-000-male", "en", "en", "describe", "p", "x", "0" * 64, 1)
    one = served(cards, tmp_path, base_url="http://gpu-a:8000/v1")
    many = served(cards, tmp_path, endpoints=[{"url": "http://gpu-a:8000/v1", "weight": 2, "max_concurrency": 3},
                                              {"url": "http://gpu-b:8000/v1"}])
    card = json.loads((cards / "served.yaml").read_text())
    (cards / "served.yaml").write_text(json.dumps(card | {"endpoints": ["http://gpu-c:8000/v1"]}))
    from_card = served(cards, tmp_path)
    assert [e.url for e in from_card.endpoints] == ["http://gpu-c:8000/v1"]
    assert cache_key(one, req) == cache_key(many, req) == cache_key(from_card, req)
    assert many.max_concurrency == 3 + 8  # an endpoint without max_concurrency takes the system's
    for s in (one, many, from_card):
        s.close()
    with pytest.raises(ParamsError, match="not both"):
        served(cards, tmp_path, base_url="http://a/v1", endpoints=[{"url": "http://b/v1"}])

    stim = make_stimuli(tmp_path, 1)
    with FakeOpenAIAudioServer("EMPTY") as server:
        system = served(cards, tmp_path, base_url=server.base_url)
        table, _, _, _ = run(system, stim, tmp_path, tmp_path / "cache")
        system.close()
    assert "endpoint" not in json.loads(table.provenance.iloc[0])
    entry = ResponseCache(tmp_path / "cache").get(table.cache_key.iloc[0])
    assert entry["provenance"]["endpoint"].rstrip("/") == server.base_url  # kept where it is untracked
