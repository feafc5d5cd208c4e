"""Usage and cost: tokens by kind as the servers report them, the card's dated price table, and
per-run totals that equal the usage the server sent, summed by hand."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import soundfile as sf

from tests.fakes.openai_server import FakeOpenAIAudioServer, fingerprint_file
from tests.fakes.stimuli import make_stimuli
from voicebias.cost import call_cost, tokens, usage_table, usage_totals, validate_pricing
from voicebias.errors import ConfigError
from voicebias.systems.catalog import build_system
from voicebias.systems.runner import ResponseCache, RetryPolicy, run_task
from voicebias.tasks import load_tasks

KEY = "sk-test-openai-0123456789abcdefCOST"
#: gpt-4o-audio-preview's prices per million tokens (developers.openai.com, read 2026-12-05)
PRICING = validate_pricing(
    {
        "currency": "USD",
        "per_million_tokens": {"input_text": 2.5, "input_audio": 40.0, "output_text": 10.0, "output_audio": 80.0},
        "source": "https://developers.openai.com/api/docs/models/gpt-4o-audio-preview",
        "date": "2026-12-05",
    },
    "test",
)


def test_openai_usage_is_read_by_kind_and_missing_text_is_the_rest_of_the_total():
    full = {
        "prompt_tokens": 157,
        "completion_tokens": 46,
        "total_tokens": 203,
        "prompt_tokens_details": {"audio_tokens": 150, "cached_tokens": 0, "text_tokens": 7},
        "completion_tokens_details": {"audio_tokens": 40, "reasoning_tokens": 0, "text_tokens": 6},
    }
    t = tokens(full)
    assert (t["input"], t["output"]) == (157, 46)
    assert (t["input_audio"], t["input_text"], t["output_audio"], t["output_text"]) == (150, 7, 40, 6)
    # an older reply: the audio tokens but no text tokens; the text is the rest of the total
    older = {**full, "prompt_tokens_details": {"audio_tokens": 150, "cached_tokens": 30}}
    assert tokens(older)["input_text"] == 7 and tokens(older)["input_cached"] == 30
    # vLLM: totals only, details null: the kinds are unknown, not zero
    vllm = {"prompt_tokens": 90, "completion_tokens": 12, "total_tokens": 102, "prompt_tokens_details": None}
    t = tokens(vllm)
    assert (t["input"], t["output"]) == (90, 12) and t["input_audio"] is None and t["output_text"] is None
    # nothing reported, or something that is not a usage block
    assert all(v is None for v in tokens(None).values())
    assert all(v is None for v in tokens("160").values())
    assert tokens({"prompt_tokens": -3, "completion_tokens": "x"})["input"] is None


def test_gemini_usage_is_read_per_modality():
    usage = {
        "prompt_token_count": 140,
        "response_token_count": 16,
        "total_token_count": 156,
        "prompt_tokens_details": [{"modality": "TEXT", "token_count": 12}, {"modality": "AUDIO", "token_count": 128}],
        "response_tokens_details": [{"modality": "AUDIO", "token_count": 13}, {"modality": "TEXT", "token_count": 3}],
        "thoughts_token_count": 5,
    }
    t = tokens(usage)
    assert (t["input"], t["output"], t["output_reasoning"]) == (140, 16, 5)
    assert (t["input_text"], t["input_audio"], t["output_text"], t["output_audio"]) == (12, 128, 3, 13)
    # only the total: every kind unknown
    assert tokens({"prompt_token_count": 140})["input_audio"] is None


def test_price_of_a_call_is_tokens_times_the_price_per_million_and_unknown_kinds_are_unpriced():
    counts = {"input_text": 7, "input_audio": 150, "output_text": 6, "output_audio": 40}
    assert call_cost(counts, PRICING) == pytest.approx((7 * 2.5 + 150 * 40 + 6 * 10 + 40 * 80) / 1e6, rel=1e-12)
    assert call_cost({**counts, "input_audio": None}, PRICING) is None  # never guessed
    assert call_cost(counts, None) is None
    free_audio = validate_pricing({**PRICING, "per_million_tokens": {"input_text": 1.0, "input_audio": 0}}, "t")
    assert call_cost({"input_text": 10, "input_audio": None}, free_audio) == pytest.approx(1e-5)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"date": "last week"}, "YYYY-MM-DD"),
        ({"source": "the website"}, "http(s) address"),
        ({"currency": ""}, "pricing.currency is required"),
        ({"per_million_tokens": {"input_video": 1.0}}, "unknown kind 'input_video'"),
        ({"per_million_tokens": {"input_text": -1}}, "must be a price >= 0"),
        ({"per_million_tokens": {}}, "must map token kinds"),
        ({"discount": 0.5}, "unknown key(s) ['discount']"),
        ({"audio_tokens_per_second": {"input": 10}}, "a source address"),
    ],
)
def test_a_malformed_price_table_is_refused_naming_the_field(change, message):
    entry = {**PRICING, **change}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        validate_pricing(entry, "system card models/cards/x.yaml")


def _responses(rows: list[dict]) -> pd.DataFrame:
    base = {"system": "s", "task": "describe", "output_duration_s": 0.3, "attempts": 1}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_a_call_answering_several_rows_counts_once_and_an_unsent_row_not_at_all():
    usage = {"prompt_tokens": 10, "completion_tokens": 4, "prompt_tokens_details": {"audio_tokens": 8}}
    prov = json.dumps({"usage": usage})
    table = _responses(
        [
            {"stimulus_id": "a", "cache_key": "k1", "status": "ok", "provenance": prov},
            {"stimulus_id": "a", "cache_key": "k1", "status": "ok", "provenance": prov},  # shared call
            {"stimulus_id": "b", "cache_key": "k2", "status": "failed", "provenance": "{}", "attempts": 0},
            {"stimulus_id": "c", "cache_key": "k3", "status": "failed", "provenance": prov},  # billed, failed
        ]
    )
    calls = usage_table(table, {"a": 2.0, "b": 3.0, "c": 4.0}, None, "s2s")
    assert list(calls["stimulus_id"]) == ["a", "c"]
    totals = usage_totals(calls, None)
    assert totals["calls"] == 2 and totals["input_audio_s"] == 6.0 and totals["output_audio_s"] == pytest.approx(0.6)
    assert totals["input_tokens"] == 20 and totals["input_audio_tokens"] == 16 and totals["input_text_tokens"] == 4
    assert totals["output_audio_tokens"] is None and totals["cost"] is None  # not reported, no price table


def test_run_totals_equal_the_usage_the_server_sent_summed_by_hand(tmp_path, monkeypatch):
    """gpt_audio against the fake API, with retries and a failed reply that was billed all the
    same: the totals are the sums of the usage blocks the server sent, and the cost is those sums
    priced by hand."""
    stim = make_stimuli(tmp_path, 12)
    fps = [fingerprint_file(tmp_path / p) for p in stim["path"]]
    seconds = pd.Series([sf.info(str(tmp_path / p)).duration for p in stim["path"]])
    plan = {fps[0]: ["500"], fps[1]: ["429", "429"], fps[2]: ["noaudio"], fps[3]: ["400"]}
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    task = load_tasks()["describe"]
    with FakeOpenAIAudioServer(KEY, plan=plan) as server:
        params = {"model": "gpt-4o-audio-preview", "voice": "alloy", "base_url": server.base_url, "timeout_s": 5.0}
        system = build_system("gpt_audio", params, root=tmp_path)
        policy = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)
        table, _ = run_task(
            system,
            task,
            stim,
            tmp_path / "out",
            ResponseCache(tmp_path / "c"),
            1,
            tmp_path,
            policy=policy,
            progress=False,
        )
        system.close()
        sent = list(server.usage_sent)
    assert len(sent) == 11  # 12 inputs; the 400 got no completion, so no usage
    calls = usage_table(table, dict(zip(stim["stimulus_id"], seconds)), PRICING, "s2s")
    totals = usage_totals(calls, PRICING)
    by_hand = {
        "input_text": sum(u["prompt_tokens_details"]["text_tokens"] for u in sent),
        "input_audio": sum(u["prompt_tokens_details"]["audio_tokens"] for u in sent),
        "output_text": sum(u["completion_tokens_details"]["text_tokens"] for u in sent),
        "output_audio": sum(u["completion_tokens_details"]["audio_tokens"] for u in sent),
    }
    for kind, n in by_hand.items():
        assert totals[f"{kind}_tokens"] == n, kind
    assert totals["input_tokens"] == sum(u["prompt_tokens"] for u in sent)
    assert totals["output_tokens"] == sum(u["completion_tokens"] for u in sent)
    assert totals["calls"] == 12 and totals["calls_with_usage"] == 11 and totals["priced_calls"] == 11
    price = PRICING["per_million_tokens"]
    assert totals["cost"] == pytest.approx(sum(n * price[k] / 1e6 for k, n in by_hand.items()), rel=1e-9)
    assert totals["input_audio_s"] == pytest.approx(float(seconds.sum()), abs=1e-3)
    # the failed reply without audio was billed: it is in the totals, with its status
    billed_failed = calls[(calls["status"] == "failed") & calls["input_tokens"].notna()]
    assert len(billed_failed) == 1 and billed_failed["cost"].iloc[0] > 0
    assert totals["input_audio_tokens"] == sum(math.ceil(10 * d) for d in seconds.drop(index=3))
