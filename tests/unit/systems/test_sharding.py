"""One system's requests sharded across several endpoints, end to end through the runner against
fake OpenAI audio and vLLM-Omni servers on loopback (the real protocols, a fixed latency per request).

What users rely on: with several endpoints every request is answered exactly once, even
when an endpoint dies mid-run; none is lost or filled in; the responses table and the
audio files are byte-identical to a one-endpoint run; no endpoint holds more requests
than its max_concurrency; and weights steer the shares (the speed-up with more endpoints
is measured by benchmarks/bench_endpoints.py).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest

from tests.fakes.openai_server import FakeOpenAIAudioServer, fingerprint_file
from tests.fakes.stimuli import make_stimuli
from tests.fakes.vllm_omni_server import FakeVLLMOmniServer, pinned_cards, snapshot_root
from tests.support.respond import run
from voicebias.cards import load_card
from voicebias.errors import SetupError
from voicebias.params import ParamsError
from voicebias.systems.base import S2SRequest
from voicebias.systems.catalog import build_system
from voicebias.systems.runner import ResponseCache, RetryPolicy, cache_key, validate_responses
from voicebias.tasks import load_tasks


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


def kill_after(victim, n: int) -> threading.Thread:
    """A thread that kills `victim` once it has delivered `n` answers (started; join it after the run)."""

    def kill():
        deadline = time.perf_counter() + 20
        while sum(victim.delivered().values()) < n and time.perf_counter() < deadline:
            time.sleep(0.002)
        victim.kill()

    killer = threading.Thread(target=kill)
    killer.start()
    return killer


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

    with (
        FakeOpenAIAudioServer("EMPTY", latency_s=latency) as a,
        FakeOpenAIAudioServer("EMPTY", latency_s=latency) as b,
        FakeOpenAIAudioServer("EMPTY", latency_s=latency) as c,
    ):
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

    with (
        FakeOpenAIAudioServer("EMPTY", latency_s=0.05) as a,
        FakeOpenAIAudioServer("EMPTY", latency_s=0.05) as victim,
        FakeOpenAIAudioServer("EMPTY", latency_s=0.05) as c,
    ):
        killer = kill_after(victim, 3)
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
    with FakeOpenAIAudioServer("EMPTY") as a, FakeOpenAIAudioServer("EMPTY") as b, FakeOpenAIAudioServer("EMPTY") as c:
        # one request at a time (spare capacity everywhere): the shares are the weights'
        system = served(cards, tmp_path, endpoints=shards([a, b, c], [2, 2, 2], weights=[3, 2, 1]))
        for s in stim.itertuples():
            req = S2SRequest(
                s.stimulus_id, "en", "en", "describe", task.prompt("en"), str(tmp_path / s.path), s.sha256, 1
            )
            assert system.respond(req).status == "ok"
        system.close()
        shares = requests_per_server([a, b, c])
    assert shares == [16, 11, 5]  # 3:2:1 of 32, the round-robin's exact order

    with (
        FakeOpenAIAudioServer("EMPTY", latency_s=0.05) as a,
        FakeOpenAIAudioServer("EMPTY", latency_s=0.05) as b,
        FakeOpenAIAudioServer("EMPTY", latency_s=0.05) as c,
    ):
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
        # the servers answer the pre-run check, then die: each request fails over from one to the other
        # (a breaker that never opens here: the breaker's own tests are in test_breaker.py)
        system = served(cards, tmp_path, endpoints=shards([a, b], [2, 2]), breaker={"failures": 100})
        system.check()
        a.kill()
        b.kill()
        table, counts, _, files = run(
            system,
            stim,
            tmp_path,
            tmp_path / "cache",
            policy=RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.02),
            check=lambda: None,
        )
        system.close()
        # dead before the run starts: the pre-run check stops it, naming both
        again = served(cards, tmp_path, endpoints=shards([a, b], [2, 2]))
        with pytest.raises(
            SetupError,
            match=rf"cannot reach any of its 2 endpoints: {a.base_url} \(connection "
            rf"refused\); {b.base_url} \(connection refused\)",
        ):
            run(again, stim, tmp_path, tmp_path / "cache2")
    assert (table.status == "failed").all() and counts["failed"] == 3
    assert table.error.str.startswith("transient error after 2 attempts: every endpoint is down (2 endpoints").all()
    assert table.transcript.isna().all() and table.output_audio.isna().all()
    assert list(files) == ["responses.csv"]
    assert not any(ResponseCache(tmp_path / "cache").root.glob("*/*"))  # nothing cached: tried again next run
    assert not (tmp_path / "cache2").exists() or not any((tmp_path / "cache2").rglob("response.json"))


def test_endpoints_are_no_part_of_the_cache_key_and_stay_in_the_cache_entry(tmp_path, cards):
    req = S2SRequest("en-masculine-000-male", "en", "en", "describe", "p", "x", "0" * 64, 1)
    one = served(cards, tmp_path, base_url="http://gpu-a:8000/v1")
    many = served(
        cards,
        tmp_path,
        endpoints=[{"url": "http://gpu-a:8000/v1", "weight": 2, "max_concurrency": 3}, {"url": "http://gpu-b:8000/v1"}],
    )
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


QWEN = "Qwen/Qwen2.5-Omni-7B"


def omni(cards, root, **params):
    return build_system("qwen2_5_omni_vllm", {"timeout_s": 10.0, **params}, cards_dir=cards, root=root)


def omni_server(home, **kw):
    """A fake vLLM-Omni server of QWEN at the pinned snapshot, loaded from the Hugging Face cache under `home`."""
    return FakeVLLMOmniServer(QWEN, root=snapshot_root(home, QWEN), **kw)


def test_vllm_omni_endpoint_killed_mid_run_loses_nothing_and_changes_no_byte(tmp_path):
    n = 30
    stim = make_stimuli(tmp_path, n)
    fps = [fingerprint_file(tmp_path / p) for p in stim["path"]]
    cards = pinned_cards(tmp_path)
    with omni_server("/home/one") as one:
        system = omni(cards, tmp_path, base_url=one.base_url, max_concurrency=4)
        table1, counts1, _, files1 = run(system, stim, tmp_path, tmp_path / "cache1")
        system.close()
    answered_once([one], fps)
    assert counts1["failed"] == 0

    # three servers on three machines (each its own Hugging Face cache path), one killed mid-run
    with (
        omni_server("/home/a", latency_s=0.05) as a,
        omni_server("/root", latency_s=0.05) as victim,
        omni_server("/srv/c", latency_s=0.05) as c,
    ):
        system = omni(cards, tmp_path, endpoints=shards([a, victim, c], [2, 2, 2]))
        assert system.max_concurrency == 6
        killer = kill_after(victim, 3)
        table3, counts3, _, files3 = run(system, stim, tmp_path, tmp_path / "cache3")
        killer.join()
        facts = {e["endpoint"]: e for e in system.run_facts()["endpoints"]}
        system.close()
        for s in (a, victim, c):  # every endpoint asked what it runs, once, before the first call
            assert s.gets == ["/version", "/v1/models"]

    dead = facts[victim.base_url]
    victim.wait_idle()
    assert 3 <= sum(victim.delivered().values()) < n and dead["unreachable"] >= 1, "not killed mid-run"
    answered_once([a, victim, c], fps)  # every request answered exactly once over the three; none lost
    assert (table3.status == "ok").all() and counts3["failed"] == 0 and counts3["calls"] == n
    assert sum(e["answered"] for e in facts.values()) == n
    assert (table3["attempts"] == 1).all()  # moved to another endpoint within the call, not retried later
    assert max(a.max_in_flight, victim.max_in_flight, c.max_in_flight) <= 2
    validate_responses(table3)
    # responses.csv and every audio file byte for byte as with one endpoint (the cache keys included)
    assert sorted(files3) == sorted(files1) and len(files1) == n + 1
    for name in files1:
        assert files3[name] == files1[name], name
    csv = files3["responses.csv"].decode()
    assert "127.0.0.1" not in csv and "/home/" not in csv and "snapshots/" not in csv
    entry = ResponseCache(tmp_path / "cache3").get(table3.cache_key.iloc[0])
    assert entry["provenance"]["endpoint"] in {s.base_url for s in (a, victim, c)}  # kept where it is untracked
    assert entry["provenance"]["served_root"].endswith(f"snapshots/{entry['model_revision']}")


def test_vllm_omni_endpoints_must_serve_the_same_model_and_revision(tmp_path, capsys):
    cards = pinned_cards(tmp_path)
    stim = make_stimuli(tmp_path, 1)
    task = load_tasks()["describe"]
    s = stim.iloc[0]
    req = S2SRequest(s.stimulus_id, "en", "en", "describe", task.prompt("en"), str(tmp_path / s.path), s.sha256, 1)
    with omni_server("/home/a") as a, omni_server("/home/b", vllm_version="0.11.1") as b:
        system = omni(cards, tmp_path, endpoints=shards([a, b], [1, 1]))
        with pytest.raises(
            SetupError,
            match=f"endpoint {b.base_url} does not serve what {a.base_url} serves "
            r"\(vllm_version: '0.11.1' there, '0.11.0'",
        ):
            cache_key(system, req)
    with omni_server("/home/a") as a, omni_server("/home/b", max_model_len=8192) as b:
        with pytest.raises(SetupError, match=f"{b.base_url} does not serve .*model.max_model_len: 8192"):
            omni(cards, tmp_path, endpoints=shards([a, b], [1, 1])).respond(req)
    with omni_server("/home/a") as a, FakeVLLMOmniServer(QWEN, root=snapshot_root("/home/b", QWEN, "e" * 40)) as b:
        with pytest.raises(SetupError, match=f"the server at {b.base_url} runs snapshot e{{40}}"):
            omni(cards, tmp_path, endpoints=shards([a, b], [1, 1])).server_info()
    with omni_server("/home/a") as a, FakeVLLMOmniServer("Qwen/Qwen3-Omni-30B-A3B-Instruct") as b:
        with pytest.raises(SetupError, match=f"the server at {b.base_url} serves Qwen/Qwen3-Omni"):
            omni(cards, tmp_path, endpoints=shards([a, b], [1, 1])).server_info()
    with omni_server("/home/b") as gone:
        url = gone.base_url
    with omni_server("/home/a") as a:
        # an endpoint that does not answer is left out of the run, named; the run goes on with the others
        system = omni(cards, tmp_path, endpoints=[{"url": a.base_url}, {"url": url}])
        capsys.readouterr()
        assert system.server_info()["model"]["id"] == QWEN
        said = capsys.readouterr().err
        assert (
            f"1 of 2 endpoints do not answer, left out of this run: {url} (no vLLM-Omni server answers at "
            f"{url[:-3]}/version"
            in said
            and said.count("\n") == 1
        )
        assert system.respond(req).status == "ok"
        a.wait_idle()  # a reply is logged just after it is sent
        assert len(a.chats()) == 1
        assert system.pool.stats()[1]["sent"] == 0 and system.pool.stats()[1]["breaker"] == "left out"
        with pytest.raises(
            SetupError,
            match=f"cannot reach {url} \\(no vLLM-Omni server answers at {url[:-3]}/version"
            ".*start the servers as docs/serving.md says",
        ):
            omni(cards, tmp_path, endpoints=[{"url": url}]).server_info()


def test_vllm_omni_endpoints_are_no_part_of_the_cache_key(tmp_path, monkeypatch):
    cards = pinned_cards(tmp_path)
    stim = make_stimuli(tmp_path, 1)
    s = stim.iloc[0]
    req = S2SRequest(s.stimulus_id, "en", "en", "describe", "p", str(tmp_path / s.path), s.sha256, 1)
    with omni_server("/home/a") as a, omni_server("/root") as b, omni_server("/srv/c") as c:
        one = omni(cards, tmp_path, base_url=a.base_url)
        many = omni(cards, tmp_path, endpoints=shards([b, c], [3, 1], weights=[2, 1]))
        endpoints_file = tmp_path / "endpoints.json"
        endpoints_file.write_text(json.dumps({"qwen2_5_omni_vllm": shards([c], [2])}))
        monkeypatch.setenv("VOICEBIAS_ENDPOINTS", str(endpoints_file))
        from_file = omni(cards, tmp_path)
        assert from_file.endpoints_source == str(endpoints_file) and from_file.max_concurrency == 2
        assert cache_key(one, req) == cache_key(many, req) == cache_key(from_file, req)
        assert many.max_concurrency == 4
    with pytest.raises(ParamsError, match="not both"):
        omni(cards, tmp_path, base_url="http://a/v1", endpoints=[{"url": "http://b/v1"}])
