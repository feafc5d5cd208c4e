"""vLLM-Omni adapter against a local fake server speaking vLLM-Omni's chat-completions protocol.

What users rely on: the request has the documented shape (audio_url data URI, the task
prompt, modalities, one sampling mapping per stage with the item's own seed); text and
audio are read from their two choices; a reply without audio is a recorded failure;
HTTP errors retry through the runner's policy; and the cache key follows exactly what
changes an answer: model revision, engine version, sampling parameters, deploy settings,
seed, and nothing that only steers the call.
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pandas as pd
import pytest
import soundfile as sf

from tests.fakes.openai_server import fingerprint_file
from tests.fakes.stimuli import make_stimuli
from tests.fakes.vllm_omni_server import DATA_URI, PIN, FakeVLLMOmniServer, pinned_cards
from voicebias.cards import load_card
from voicebias.config import CARDS_DIR
from voicebias.errors import SetupError
from voicebias.params import ParamsError
from voicebias.systems.base import S2SRequest, item_seed
from voicebias.systems.catalog import build_system
from voicebias.systems.runner import ResponseCache, RetryPolicy, cache_key, run_task, validate_responses
from voicebias.tasks import load_tasks

QWEN = "Qwen/Qwen2.5-Omni-7B"


def request_for(tmp_path, stim, i=0, task="describe", seed=7):
    s = stim.iloc[i]
    t = load_tasks()[task]
    return S2SRequest(
        stimulus_id=s.stimulus_id,
        lang=s.lang,
        target_lang=t.target_lang(s.lang),
        task=task,
        prompt=t.prompt(s.lang),
        audio_path=str(tmp_path / s.path),
        audio_sha256=s.sha256,
        seed=seed,
    )


def system(server, cards, name="qwen2_5_omni_vllm", root=None, **params):
    return build_system(name, {"base_url": server.base_url, "timeout_s": 5.0, **params}, cards_dir=cards, root=root)


def test_request_has_the_documented_shape_and_reply_is_parsed(tmp_path):
    stim = make_stimuli(tmp_path, 1, langs=("es",))
    req = request_for(tmp_path, stim)
    cards = pinned_cards(tmp_path)
    with FakeVLLMOmniServer(QWEN, vllm_version="0.11.0") as server:
        resp = system(server, cards).respond(req)
    assert server.gets == ["/version", "/v1/models"]  # asked what it runs, once, before the call
    [logged] = server.chats()
    body = logged.body
    card = load_card("qwen2_5_omni_vllm")
    assert body["model"] == QWEN and body["modalities"] == ["text", "audio"]
    system_msg, user_msg = body["messages"]
    assert system_msg == {"role": "system", "content": [{"type": "text", "text": card["request"]["system_prompt"]}]}
    audio_part, text_part = user_msg["content"]
    assert audio_part["type"] == "audio_url" and audio_part["audio_url"]["url"].startswith(DATA_URI)
    raw = base64.b64decode(audio_part["audio_url"]["url"][len(DATA_URI) :])
    assert sf.info(io.BytesIO(raw)).format == "WAV"
    assert logged.fingerprint == fingerprint_file(tmp_path / stim.path[0])  # samples sent unchanged
    assert text_part == {"type": "text", "text": load_tasks()["describe"].prompt("es")}
    seed = item_seed(7, req.stimulus_id)
    assert seed != 7
    assert body["sampling_params_list"] == [dict(s, seed=seed) for s in card["request"]["sampling_params_list"]]
    assert "continue_final_message" not in body
    # the reply: text from one choice, audio (24 kHz WAV) from the other
    assert resp.status == "ok" and resp.transcript == f"reply to {logged.fingerprint[:12]} seed {seed}"
    assert resp.sample_rate == 24000 and resp.audio.size == 7200
    prov = resp.provenance
    assert prov["model_revision"] == PIN and prov["seed"] == seed
    assert prov["engine"] == {"name": "vllm-omni", "vllm_version": "0.11.0", "deploy_engine_version": "0.30.0"}
    assert prov["served"] == {"id": QWEN, "snapshot": None, "max_model_len": 32768, "owned_by": "vllm"}
    assert prov["served_root"] == QWEN and prov["deploy"]["batch_invariant"] is True
    assert prov["endpoint"].startswith("http://127.0.0.1:")


def test_a_merged_single_choice_reply_reads_as_the_two_choice_reply(tmp_path):
    """vLLM-Omni's two-choice reply (text in one choice, audio in another) and the merged single
    choice its open fixes send (vllm-omni issue #7376) give the same response."""
    stim = make_stimuli(tmp_path, 1)
    cards = pinned_cards(tmp_path)
    got = {}
    for shape in ("two_choices", "merged"):
        with FakeVLLMOmniServer(QWEN, reply_shape=shape) as server:
            got[shape] = system(server, cards).respond(request_for(tmp_path, stim))
    a, b = got["two_choices"], got["merged"]
    assert a.status == b.status == "ok" and a.transcript == b.transcript and a.transcript.startswith("reply to ")
    assert a.sample_rate == b.sample_rate == 24000 and np.array_equal(a.audio, b.audio)
    assert len(b.provenance["finish_reasons"]) == 1 and len(a.provenance["finish_reasons"]) == 2


def test_step_audio2_opens_the_assistant_turn_with_tts_start(tmp_path):
    stim = make_stimuli(tmp_path, 1)
    req = request_for(tmp_path, stim, task="readback")
    cards = pinned_cards(tmp_path, "step_audio2_vllm")
    with FakeVLLMOmniServer("stepfun-ai/Step-Audio-2-mini", stages=2) as server:
        resp = system(server, cards, "step_audio2_vllm").respond(req)
    body = server.chats()[0].body
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant"]
    assert body["messages"][0]["content"] == [{"type": "text", "text": req.prompt}]  # the task prompt
    assert [p["type"] for p in body["messages"][1]["content"]] == ["audio_url"]
    assert body["messages"][2] == {"role": "assistant", "content": "<tts_start>"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert len(body["sampling_params_list"]) == 2 and resp.status == "ok"


def test_reply_without_audio_is_a_recorded_failure(tmp_path):
    stim = make_stimuli(tmp_path, 3)
    fps = [fingerprint_file(tmp_path / p) for p in stim["path"]]
    cards = pinned_cards(tmp_path)
    task = load_tasks()["describe"]
    cache = ResponseCache(tmp_path / "cache")
    with FakeVLLMOmniServer(QWEN, plan={fps[0]: ["noaudio"], fps[1]: ["notwav"], fps[2]: ["noaudio"]}) as server:
        s = system(server, cards)
        resp = s.respond(request_for(tmp_path, stim, 0))
        assert resp.status == "failed" and resp.audio is None and resp.transcript is None
        assert "no audio" in resp.error and "the model wrote: reply to" in resp.error
        table, counts = run_task(s, task, stim, tmp_path / "out", cache, 1, tmp_path, progress=False)
        by_id = table.set_index("stimulus_id")
        # the first stimulus got past its plan; the second's reply audio is no WAV, the third's has none
        assert by_id.loc[stim.stimulus_id[0], "status"] == "ok"
        assert "not a WAV" in by_id.loc[stim.stimulus_id[1], "error"]
        assert by_id.loc[stim.stimulus_id[2], "error"].startswith("reply has no audio (1 choice(s), text only)")
        for i in (1, 2):
            row = by_id.loc[stim.stimulus_id[i]]
            assert row.status == "failed" and pd.isna(row.output_audio) and pd.isna(row.transcript)
        assert counts["failed"] == 2
        n = len(server.chats())
        # a failure is not cached: the next run asks again, the successes come from the cache
        table2, counts2 = run_task(s, task, stim, tmp_path / "out2", cache, 1, tmp_path, progress=False)
    assert counts2["cache_hits"] == 1 and counts2["calls"] == 2 and len(server.chats()) == n + 2
    assert (table2.status == "ok").all()


def test_http_errors_retry_through_the_runner_policy(tmp_path):
    stim = make_stimuli(tmp_path, 6)
    fps = [fingerprint_file(tmp_path / p) for p in stim["path"]]
    plan = {
        fps[0]: ["503"],
        fps[1]: ["429", "500"],
        fps[2]: ["400"],
        fps[3]: ["timeout"],
        fps[4]: ["500", "500", "500"],
        fps[5]: ["500invalid"],  # a 500 that names an invalid request: the same request fails the same way
    }
    cards = pinned_cards(tmp_path)
    policy = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)
    with FakeVLLMOmniServer(QWEN, plan=plan, hang_s=1.5) as server:
        s = system(server, cards, timeout_s=0.5)
        table, counts = run_task(
            s,
            load_tasks()["describe"],
            stim,
            tmp_path / "o",
            ResponseCache(tmp_path / "c"),
            1,
            tmp_path,
            policy=policy,
            progress=False,
        )
    by_id = table.set_index("stimulus_id")
    attempts = {0: 2, 1: 3, 2: 1, 3: 2, 4: 3, 5: 1}
    for i, n in attempts.items():
        assert by_id.loc[stim.stimulus_id[i], "attempts"] == n, i
    assert set(table.loc[table.status == "failed", "stimulus_id"]) == set(stim.stimulus_id[[2, 4, 5]])
    assert "HTTP 500: SamplingParams.__init__() got an unexpected keyword" in by_id.loc[stim.stimulus_id[5], "error"]
    assert "HTTP 400: audio is too long" in by_id.loc[stim.stimulus_id[2], "error"]
    assert "transient error after 3 attempts: HTTP 500" in by_id.loc[stim.stimulus_id[4], "error"]


def keys(tmp_path, tag, *, vllm_version="0.11.0", seed=7, card_changes=None, **params):
    """The cache key of one request for a system built from its own cards folder and server."""
    stim = make_stimuli(tmp_path, 1)
    (tmp_path / tag).mkdir()
    cards = pinned_cards(tmp_path / tag, **(card_changes or {}))
    with FakeVLLMOmniServer(QWEN, vllm_version=vllm_version) as server:
        s = system(server, cards, **params)
        return cache_key(s, request_for(tmp_path, stim, seed=seed))


def test_cache_key_follows_what_changes_an_answer_and_nothing_else(tmp_path):
    base = keys(tmp_path, "base")
    sampling = load_card("qwen2_5_omni_vllm")["request"]["sampling_params_list"]
    hotter = [dict(sampling[0], temperature=0.7)] + sampling[1:]
    changed = {
        "revision": keys(tmp_path, "rev", card_changes={"revision": "f" * 40}),
        "engine version": keys(tmp_path, "eng", vllm_version="0.11.1"),
        "sampling (params)": keys(tmp_path, "spl", sampling_params_list=hotter),
        "sampling (card)": keys(tmp_path, "spc", card_changes={"request.sampling_params_list": hotter}),
        "batch invariance": keys(tmp_path, "bi", deploy={"batch_invariant": False}),
        "deploy (card)": keys(tmp_path, "dep", card_changes={"deploy.engine_version": "0.31.0"}),
        "seed": keys(tmp_path, "seed", seed=8),
        # deploy facts that change the numerics: tensor-parallel size and the stage/deploy config's hash
        "tensor parallel": keys(tmp_path, "tp", deploy={"tensor_parallel_size": 2}),
        "deploy config": keys(tmp_path, "dcfg", deploy={"deploy_config_sha256": "ab" * 32}),
    }
    assert all(k != base for k in changed.values()), [n for n, k in changed.items() if k == base]
    assert len(set(changed.values())) == len(changed)
    # another server (port), timeout and concurrency, the same deploy default spelled out: the same key
    same = keys(tmp_path, "same", timeout_s=9.0, max_concurrency=2, deploy={"batch_invariant": True})
    assert same == base


def test_per_item_seeds_are_derived_from_base_seed_and_stimulus_id():
    assert item_seed(1, "en-a") == item_seed(1, "en-a")
    assert len({item_seed(1, f"en-{i}") for i in range(50)}) == 50
    assert item_seed(1, "en-a") != item_seed(2, "en-a")


def test_runs_through_the_runner_over_stimuli_with_outputs_written(tmp_path):
    stim = make_stimuli(tmp_path, 4, langs=("en", "es"))
    cards = pinned_cards(tmp_path)
    task = load_tasks()["describe"]
    cache = ResponseCache(tmp_path / "cache")
    with FakeVLLMOmniServer(QWEN) as server:
        s = system(server, cards, max_concurrency=3)
        table, counts = run_task(s, task, stim, tmp_path / "out", cache, 11, tmp_path, progress=False)
        validate_responses(table)
        table2, counts2 = run_task(s, task, stim, tmp_path / "out2", cache, 11, tmp_path, progress=False)
    assert (table.status == "ok").all() and counts["calls"] == 8 and counts["failed"] == 0
    for row in table.itertuples():
        out = tmp_path / row.output_audio
        assert out.exists() and sf.info(str(out)).samplerate == 24000
        prov = json.loads(row.provenance)
        assert prov["seed"] == item_seed(11, row.stimulus_id)
        assert row.transcript.endswith(f"seed {prov['seed']}") and row.model_revision == PIN
    seeds = {b.body["sampling_params_list"][0]["seed"] for b in server.chats()}
    assert len(seeds) == 8  # each stimulus its own seed
    assert counts2["cache_hits"] == 8 and counts2["calls"] == 0 and len(server.chats()) == 8
    assert table2.output_sha256.tolist() == table.output_sha256.tolist()


def test_setup_errors_name_what_is_wrong(tmp_path):
    unpinned = tmp_path / "unpinned"
    unpinned.mkdir()
    (unpinned / "qwen2_5_omni_vllm.yaml").write_text((CARDS_DIR / "qwen2_5_omni_vllm.yaml").read_text())
    with pytest.raises(SetupError, match="--revision"):
        build_system("qwen2_5_omni_vllm", {}, cards_dir=unpinned)
    cards = pinned_cards(tmp_path)
    stim = make_stimuli(tmp_path, 1)
    with FakeVLLMOmniServer("Qwen/Qwen3-Omni-30B-A3B-Instruct") as server:
        with pytest.raises(SetupError, match="serves Qwen/Qwen3-Omni-30B-A3B-Instruct, not Qwen/Qwen2.5-Omni-7B"):
            system(server, cards).respond(request_for(tmp_path, stim))
    with FakeVLLMOmniServer(QWEN, root=f"/hf/models--Qwen--Qwen2.5-Omni-7B/snapshots/{'e' * 40}") as server:
        with pytest.raises(SetupError, match="card pins"):
            cache_key(system(server, cards), request_for(tmp_path, stim))
    with FakeVLLMOmniServer(QWEN) as server:
        url = server.base_url
    with pytest.raises(SetupError, match="no vLLM-Omni server answers"):
        build_system("qwen2_5_omni_vllm", {"base_url": url}, cards_dir=cards).server_info()
    with FakeVLLMOmniServer(QWEN, api_key="k-0123456789abcdef0123") as server:
        with pytest.raises(SetupError, match="VLLM_KEY"):
            system(server, cards, api_key_env="VLLM_KEY", root=tmp_path)


def test_api_key_is_sent_when_named(tmp_path, monkeypatch):
    key = "k-0123456789abcdef0123"
    monkeypatch.setenv("VLLM_KEY", key)
    stim = make_stimuli(tmp_path, 1)
    with FakeVLLMOmniServer(QWEN, api_key=key) as server:
        resp = system(server, pinned_cards(tmp_path), api_key_env="VLLM_KEY", root=tmp_path).respond(
            request_for(tmp_path, stim)
        )
    assert resp.status == "ok"


def test_the_endpoints_files_token_is_sent_in_place_of_a_key(tmp_path, monkeypatch):
    """`voicebias serve` starts vLLM with a token (VLLM_API_KEY) and writes it to the endpoints file;
    the adapter sends it, and nothing it records holds it."""
    token = "serve-token-0123456789abcdef-XYZ"
    stim = make_stimuli(tmp_path, 1)
    endpoints = tmp_path / "endpoints.json"
    monkeypatch.setenv("VOICEBIAS_ENDPOINTS", str(endpoints))
    with FakeVLLMOmniServer(QWEN, api_key=token) as server:
        endpoints.write_text(json.dumps({"qwen2_5_omni_vllm": [{"url": server.base_url, "token": token}]}))
        built = build_system("qwen2_5_omni_vllm", {"timeout_s": 5.0}, cards_dir=pinned_cards(tmp_path), root=tmp_path)
        resp = built.respond(request_for(tmp_path, stim))
        endpoints.write_text(json.dumps({"qwen2_5_omni_vllm": [{"url": server.base_url, "token": "stale"}]}))
        with pytest.raises(SetupError, match="credentials refused") as refused:
            build_system("qwen2_5_omni_vllm", {"timeout_s": 5.0}, cards_dir=pinned_cards(tmp_path)).server_info()
    assert resp.status == "ok" and token not in json.dumps(resp.provenance, default=str)
    assert "stale" not in str(refused.value)
    with pytest.raises(ParamsError, match="endpoints.0"):  # a token in params is refused, not used
        build_system("qwen2_5_omni_vllm", {"endpoints": [{"url": "http://gpu:8000/v1", "token": token}]})


def test_settings_are_checked(tmp_path):
    cards = pinned_cards(tmp_path)
    # a sampling key vLLM does not take stops the params check, before any request, with the near name
    typo = [dict(s) for s in load_card("qwen2_5_omni_vllm")["request"]["sampling_params_list"]]
    typo[1]["temprature"] = typo[1].pop("temperature")
    with pytest.raises(
        ParamsError, match=r"sampling_params_list\[1\]: 'temprature' is not a vLLM sampling .*temperature"
    ):
        build_system("qwen2_5_omni_vllm", {"sampling_params_list": typo}, cards_dir=cards)
    (tmp_path / "typo").mkdir()
    typo_cards = pinned_cards(tmp_path / "typo", **{"request.sampling_params_list": typo})
    with pytest.raises(ValueError, match="'temprature' is not a vLLM sampling parameter"):  # in a card too
        build_system("qwen2_5_omni_vllm", {}, cards_dir=typo_cards)
    with pytest.raises(ParamsError, match="sampling_param_list"):
        build_system("qwen2_5_omni_vllm", {"sampling_param_list": []}, cards_dir=cards)
    seeded = [dict(s, seed=1) for s in load_card("qwen2_5_omni_vllm")["request"]["sampling_params_list"]]
    with pytest.raises(ValueError, match="sets a seed"):
        build_system("qwen2_5_omni_vllm", {"sampling_params_list": seeded}, cards_dir=cards)
    with pytest.raises(ValueError, match="2 sampling parameter sets for 3 stages"):
        build_system("qwen2_5_omni_vllm", {"sampling_params_list": seeded[:2]}, cards_dir=cards)


def test_committed_cards_load_and_name_their_checked_sources():
    for name, model in (
        ("qwen2_5_omni_vllm", QWEN),
        ("qwen3_omni_vllm", "Qwen/Qwen3-Omni-30B-A3B-Instruct"),
        ("step_audio2_vllm", "stepfun-ai/Step-Audio-2-mini"),
    ):
        card = load_card(name)
        assert card["adapter"] == "vllm_omni" and card["checkpoint"] == model
        assert card["deploy"]["batch_invariant"] is True and "--omni" in card["deploy"]["command"]
        assert len(card["request"]["sampling_params_list"]) == len(card["request"]["stages"])
        v = card["verified_against"]
        assert v["repository"] == "vllm-project/vllm-omni" and len(v["commit"]) == 40


def test_two_stimuli_with_the_same_audio_get_their_own_seeded_answers(tmp_path):
    """The item seed is in the cache key: identical audio under two stimulus ids is asked twice."""
    stim = make_stimuli(tmp_path, 2)
    twin = request_for(tmp_path, stim, i=0)
    other_id = S2SRequest(**{**twin.__dict__, "stimulus_id": "twin-of-" + twin.stimulus_id})
    (tmp_path / "c").mkdir()
    cards = pinned_cards(tmp_path / "c")
    with FakeVLLMOmniServer(QWEN) as server:
        s = system(server, cards)
        assert cache_key(s, twin) != cache_key(s, other_id)
        assert s.request_settings(other_id) == {"item_seed": item_seed(twin.seed, other_id.stimulus_id)}


def test_the_served_revision_is_verified_where_upstream_allows_and_said_plainly_where_not(
    tmp_path, monkeypatch, capsys
):
    """`vllm serve <repo> --revision <commit>` reports the repository id as its root, so the
    snapshot is not in /v1/models. voicebias serve records the --revision it started a server with
    in the endpoints file: the adapter checks it against the card; with no record it says the
    revision is not verified, on stderr and in each reply's (untracked) provenance."""
    cards = pinned_cards(tmp_path)
    stim = make_stimuli(tmp_path, 1)
    endpoints = tmp_path / "endpoints.json"
    monkeypatch.setenv("VOICEBIAS_ENDPOINTS", str(endpoints))
    with FakeVLLMOmniServer(QWEN) as server:  # root: the repository id, as upstream reports it
        endpoints.write_text(json.dumps({"qwen2_5_omni_vllm": [{"url": server.base_url, "revision": PIN}]}))
        built = build_system("qwen2_5_omni_vllm", {"timeout_s": 5.0}, cards_dir=cards, root=tmp_path)
        ok = built.respond(request_for(tmp_path, stim))
        assert ok.status == "ok" and ok.provenance["revision_check"].startswith("verified: voicebias serve")
        endpoints.write_text(json.dumps({"qwen2_5_omni_vllm": [{"url": server.base_url, "revision": "e" * 40}]}))
        with pytest.raises(SetupError, match=f"started with --revision {'e' * 40}.*the card pins {PIN}"):
            build_system("qwen2_5_omni_vllm", {"timeout_s": 5.0}, cards_dir=cards, root=tmp_path).server_info()
        endpoints.unlink()
        capsys.readouterr()
        plain = system(server, cards).respond(request_for(tmp_path, stim))
    err = capsys.readouterr().err
    assert plain.status == "ok" and plain.provenance["revision_check"].startswith("not verified")
    assert "revision not verified" in err and QWEN in err
    with pytest.raises(ParamsError, match="endpoints.0"):  # a revision in params is refused: the card says it
        build_system("qwen2_5_omni_vllm", {"endpoints": [{"url": "http://gpu:8000/v1", "revision": PIN}]})


@pytest.mark.parametrize("ignore_seed", [False, True])
def test_the_determinism_probe_flags_a_server_that_ignores_its_seed(tmp_path, ignore_seed):
    """After the run, run.determinism_probe answered requests are sent again and compared with the
    cache: a server that answers the same seeded request with the same text and audio reads 100 %;
    one that ignores the seed reads below it. A second run reads the probe from the cache and sends
    nothing."""
    cards = pinned_cards(tmp_path)
    stim = make_stimuli(tmp_path, 6)
    task = load_tasks()["describe"]
    cache = ResponseCache(tmp_path / "cache")
    policy = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)
    with FakeVLLMOmniServer(QWEN, ignore_seed=ignore_seed) as server:
        sut = system(server, cards, root=tmp_path)
        assert sut.probed
        _, counts = run_task(
            sut, task, stim, tmp_path / "out", cache, 1, tmp_path, policy=policy, progress=False, probe=4
        )
        sent = len(server.chats())
        _, again = run_task(
            sut, task, stim, tmp_path / "o2", cache, 1, tmp_path, policy=policy, progress=False, probe=4
        )
        assert len(server.chats()) == sent  # the replies and the probe's results come from the cache
    probe = counts["determinism"]
    assert sent == 6 + 4 and probe["items"] == 4 and probe["failed"] == 0
    if ignore_seed:
        assert probe["agreement"] == 0.0 and probe["text_agree"] == 0 and probe["audio_agree"] == 0
    else:
        assert probe["agreement"] == 1.0 and probe["agree"] == 4
    assert again["determinism"] == probe


def test_a_probe_the_server_cannot_answer_is_counted_failed_not_agreement(tmp_path):
    """The server answers the run, then fails every later call (HTTP 500 past the retries): the probe
    records its requests as failed and gives no agreement, and the card calls the system not probed
    rather than deterministic. Failed probes are not kept: once the server answers again, the next
    run probes them."""
    from voicebias.report.card import determinism_entry

    cards = pinned_cards(tmp_path)
    stim = make_stimuli(tmp_path, 4)
    fps = [fingerprint_file(tmp_path / p) for p in stim["path"]]
    policy = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)
    task, cache = load_tasks()["describe"], ResponseCache(tmp_path / "c")
    runs = []
    with FakeVLLMOmniServer(QWEN, plan={fp: ["ok", "500", "500"] for fp in fps}) as server:
        sut = system(server, cards, root=tmp_path)
        for i in range(2):
            _, counts = run_task(
                sut, task, stim, tmp_path / f"out{i}", cache, 1, tmp_path, policy=policy, progress=False, probe=3
            )
            runs.append(counts["determinism"])
    probe, again = runs
    assert probe == {"items": 3, "failed": 3, "text_agree": 0, "audio_agree": 0, "agree": 0, "agreement": None}
    assert determinism_entry(QWEN, {"describe": probe}, 1)["verdict"] == "not probed"
    assert again["failed"] == 0 and again["agreement"] == 1.0  # the server answers again: probed now
