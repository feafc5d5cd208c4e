"""Bank extension against LLM endpoints served locally over real HTTP: a fake server
speaking the OpenAI chat-completions protocol (writer and two judges), and one speaking
Gemini's generateContent protocol for the google-genai backend."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest
import yaml

from tests.fakes.http import send_json
from voicebias import config
from voicebias.clients.chat import GeminiChat, LLMError, OpenAICompatibleChat, TransformersChat
from voicebias.errors import StageFailed
from voicebias.params import load_params
from voicebias.pipeline.generate import run_stage
from voicebias.stimuli.bank import load_bank
from voicebias.stimuli.generate import (
    intensity,
    parse_json_reply,
    parse_rating,
)
from voicebias.stimuli.lint import lint_text

KEY = "sk-test-local"
PARAMS = load_params(config.ROOT / "profiles" / "embedded.yaml")

# test seeds: theme -> (pole, planted stereotype strength on the 0-3 coding scale)
THEMES = {
    "stacking firewood": ("masculine", 3),
    "laying paving stones": ("masculine", 2),
    "bleeding radiators": ("masculine", 1),
    "folding origami cranes": ("feminine", 3),
    "ironing table linen": ("feminine", 2),
    "arranging a bouquet": ("feminine", 1),
    "sorting recycling": ("neutral", 0),
    "watering a balcony garden": ("neutral", 0),
    "waiting for a ferry": ("neutral", 1),
    "hanging a shelf": ("masculine", 3),  # every candidate says 'she'/'ella': the linter must drop the theme
}
FILLER = {
    "en": "I check the list, gather what I need, work slowly and carefully, and stop now and then to look at "
    "the result before I go on with the next part of the job",
    "es": "reviso la lista, preparo lo que hace falta, trabajo despacio y con cuidado, y paro de vez en cuando "
    "para mirar el resultado antes de seguir con la siguiente parte del trabajo de hoy",
    "zh": "我先看清单，把要用的东西准备好，然后慢慢地、仔细地干活，时不时停下来看看效果，再接着做下一步。",
}


def fake_passage(theme: str, lang: str, sample: int) -> dict:
    body = " ".join([FILLER[lang]] * (2 if lang != "zh" else 2))
    if lang == "en":
        text = f"Today I am busy with {theme}. {body}."
        if theme == "hanging a shelf":
            text += " My neighbour says she will help."
    elif lang == "es":
        text = f"Hoy me ocupo de {theme}: {body}."
        if theme == "hanging a shelf":
            text += " Mi vecina dice que ella me ayuda."
    else:
        text = f"今天我忙着{theme}。{body}"
    return {"text": text, "gloss_en": f"Today I am busy with {theme}, working step by step (sample {sample})."}


class FakeLLM(BaseHTTPRequestHandler):
    """POST /v1/chat/completions (OpenAI protocol) and /v1beta/models/<m>:generateContent (Gemini)."""

    calls: list[dict] = []
    throttle_next = 0

    def log_message(self, *args):
        pass

    def _json(self, code, obj, headers=None):
        send_json(self, code, obj, headers)

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        headers = {k.lower(): v for k, v in self.headers.items()}  # HTTP names are case-blind
        FakeLLM.calls.append({"path": self.path, "headers": headers, "body": req})
        if re.fullmatch(r"/v1(beta)?/models/[\w.-]+:generateContent", self.path):
            return self._gemini(req)
        if self.path != "/v1/chat/completions":
            return self._json(404, {"error": {"message": "not found"}})
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            return self._json(
                401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}
            )
        if FakeLLM.throttle_next:
            FakeLLM.throttle_next -= 1
            return self._json(429, {"error": {"message": "Rate limit reached"}}, {"Retry-After": "0"})
        model = req["model"]
        system, user = req["messages"][0]["content"], req["messages"][-1]["content"]
        if model == "writer-1":
            theme = re.search(r"^Theme: (.+)$", user, re.M).group(1)
            lang = {"English": "en", "Spanish": "es", "Mandarin": "zh"}[
                re.search(r"idiomatic (English|Spanish|Mandarin)", system).group(1)
            ]
            content = json.dumps(fake_passage(theme, lang, req.get("seed", 0)), ensure_ascii=False)
        elif model in ("judge-a", "judge-b"):
            theme = next(t for t in THEMES if t in user)
            pole, strength = THEMES[theme]
            coding = {"masculine": 4 + strength, "feminine": 4 - strength, "neutral": 4 + strength}[pole]
            if model == "judge-b" and theme == "ironing table linen":
                content = "Sorry, I cannot rate this."  # a judge that breaks the format
            else:
                rating = {
                    "gender_coding": coding,
                    "pole": pole if strength or pole == "neutral" else "neutral",
                    "naturalness": 4,
                    "speaker_gender_cue": model == "judge-b" and theme == "stacking firewood",
                    "reason": "fake",
                }
                content = "```json\n" + json.dumps(rating) + "\n```"
        else:
            return self._json(404, {"error": {"message": f"The model `{model}` does not exist"}})
        self._json(
            200,
            {
                "id": "chatcmpl-" + hashlib.sha1(user.encode()).hexdigest()[:10],
                "object": "chat.completion",
                "created": 1764000000,
                "model": model,
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
            },
        )

    def _gemini(self, req):
        if self.headers.get("x-goog-api-key") != KEY:
            return self._json(
                400, {"error": {"code": 400, "message": "API key not valid.", "status": "INVALID_ARGUMENT"}}
            )
        text = req["contents"][-1]["parts"][0]["text"]
        reply = json.dumps(
            {
                "echo": text,
                "system": req["systemInstruction"]["parts"][0]["text"],
                "temperature": req["generationConfig"]["temperature"],
            }
        )
        self._json(
            200,
            {
                "candidates": [
                    {"content": {"role": "model", "parts": [{"text": reply}]}, "finishReason": "STOP", "index": 0}
                ],
                "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 5, "totalTokenCount": 10},
                "modelVersion": "gemini-test",
            },
        )


@pytest.fixture()
def server(monkeypatch):
    FakeLLM.calls = []
    FakeLLM.throttle_next = 0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeLLM)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("VOICEBIAS_TEST_LLM_KEY", KEY)
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def stage_params(base_url: str, tmp_path, **overrides) -> dict:
    seeds = tmp_path / "seeds.yaml"
    seeds.write_text(
        yaml.safe_dump(
            [
                {
                    "pole": pole,
                    "theme": theme,
                    "seed_term": theme,
                    "seed_source": None if pole == "neutral" else "test fixture",
                    "seed_statistic": None if pole == "neutral" else "planted",
                }
                for theme, (pole, _) in THEMES.items()
            ]
        ),
        encoding="utf-8",
    )
    endpoint = {
        "backend": "openai",
        "base_url": f"{base_url}/v1",
        "api_key_env": "VOICEBIAS_TEST_LLM_KEY",
        "retry_wait_s": 0.0,
    }
    gen = {
        "enabled": True,
        "languages": ["en", "es"],
        "seeds": str(seeds),
        "candidates_per_seed": 2,
        "per_cell": 2,
        "min_naturalness": 3.5,
        "min_judges": 2,
        "cache_dir": str(tmp_path / "llm-cache"),
        "writer": {**endpoint, "model": "writer-1", "temperature": 0.9},
        "judges": [{**endpoint, "name": "a", "model": "judge-a"}, {**endpoint, "name": "b", "model": "judge-b"}],
    }
    gen.update(overrides)
    return {**PARAMS, "generate": gen}


@pytest.fixture()
def empty_bank(tmp_path):
    """A bank folder with no passages, so only the test seeds are used."""
    d = tmp_path / "bank"
    d.mkdir()
    for lang in ("en", "es", "zh"):
        (d / f"{lang}.yaml").write_text("[]\n")
    return d


def test_stage_generates_lints_rates_and_selects(server, tmp_path, empty_bank):
    out, metrics = tmp_path / "generated", tmp_path / "metrics.json"
    status = run_stage(stage_params(server, tmp_path), bank_dir=empty_bank, out_dir=out, metrics_path=metrics)
    cands = pd.read_csv(out / "candidates.csv")
    assert len(cands) == 2 * len(THEMES) * 2  # languages x themes x samples
    planted = cands[cands["theme"] == "hanging a shelf"]
    assert set(planted["status"]) == {"lint_failed"}
    assert planted.loc[planted["lang"] == "en", "lint_hits"].str.contains("en_gendered_pronoun: she").all()
    assert planted.loc[planted["lang"] == "es", "lint_hits"].str.contains("es_third_person_pronoun: ella").all()
    ratings = pd.read_csv(out / "ratings.csv")
    assert len(ratings) == 2 * (cands["status"] == "lint_passed").sum()
    assert set(ratings.loc[ratings["status"] != "ok", "judge"]) == {"b"}  # the broken replies are kept, marked
    sel = pd.read_csv(out / "selection.csv")
    picked = {cell: set(g["theme"]) for cell, g in sel.groupby(["lang", "pole"])}
    for lang in ("en", "es"):
        # the strongest themes win, except firewood (judge b saw a speaker-gender cue), linen (judge b's
        # reply was unusable, so it has 1 of the 2 required ratings) and the shelf (failed the linter)
        assert picked[(lang, "masculine")] == {"laying paving stones", "bleeding radiators"}
        assert picked[(lang, "feminine")] == {"folding origami cranes", "arranging a bouquet"}
        assert picked[(lang, "neutral")] == {"sorting recycling", "watering a balcony garden"}
    assert sel.groupby(["lang", "theme"]).size().eq(1).all()
    top = sel[(sel["lang"] == "en") & (sel["pole"] == "feminine")].iloc[0]
    assert top["theme"] == "folding origami cranes" and top["intensity"] == pytest.approx(intensity("feminine", 1.0))
    # the selection is bank-format YAML that loads and passes the neutrality linters
    entries = yaml.safe_load((out / "selection" / "en.yaml").read_text(encoding="utf-8"))
    assert {e["review_status"] for e in entries} == {"unreviewed"} and all(
        "LLM panel" in e["rated_by"] for e in entries
    )
    bank = load_bank(out / "selection", ["en", "es"])
    assert len(bank) == 12 and all(lint_text(t, lang) == {} for t, lang in zip(bank["text"], bank["lang"]))
    # every request carried the key and went to the configured models
    assert {c["headers"]["authorization"] for c in FakeLLM.calls} == {f"Bearer {KEY}"}
    assert {c["body"]["model"] for c in FakeLLM.calls} == {"writer-1", "judge-a", "judge-b"}
    assert status["selected"] == 12 and json.loads(metrics.read_text())["llm_calls"] == len(FakeLLM.calls)


def test_rerun_reads_the_cache_and_reproduces_every_file(server, tmp_path, empty_bank):
    params = stage_params(server, tmp_path)
    run_stage(params, bank_dir=empty_bank, out_dir=tmp_path / "g1", metrics_path=tmp_path / "m1.json")
    n = len(FakeLLM.calls)
    run_stage(params, bank_dir=empty_bank, out_dir=tmp_path / "g2", metrics_path=tmp_path / "m2.json")
    assert len(FakeLLM.calls) == n and json.loads((tmp_path / "m2.json").read_text())["llm_calls"] == 0
    for f in (
        "candidates.csv",
        "ratings.csv",
        "selection.csv",
        "status.json",
        "selection/en.yaml",
        "selection/es.yaml",
    ):
        assert (tmp_path / "g1" / f).read_bytes() == (tmp_path / "g2" / f).read_bytes(), f


def test_short_cells_stop_the_stage_after_writing_what_was_made(server, tmp_path, empty_bank):
    with pytest.raises(StageFailed, match="fewer than 3 passages"):
        run_stage(
            stage_params(server, tmp_path, per_cell=3),
            bank_dir=empty_bank,
            out_dir=tmp_path / "g",
            metrics_path=tmp_path / "m.json",
        )
    assert (tmp_path / "g" / "candidates.csv").exists() and (tmp_path / "g" / "ratings.csv").exists()


def test_disabled_stage_calls_nothing(server, tmp_path, empty_bank):
    status = run_stage(PARAMS, bank_dir=empty_bank, out_dir=tmp_path / "g", metrics_path=tmp_path / "m.json")
    assert status["enabled"] is False and FakeLLM.calls == []
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["status.json"]


def test_openai_errors_are_clear(server, monkeypatch, tmp_path):
    chat = OpenAICompatibleChat(
        "writer-1", base_url=f"{server}/v1", api_key_env="VOICEBIAS_TEST_LLM_KEY", retry_wait_s=0
    )
    FakeLLM.throttle_next = 2
    msgs = [{"role": "system", "content": "Write natural, idiomatic English."}, {"role": "user", "content": "Theme: x"}]
    assert json.loads(chat.complete(msgs, 0.0, 50))["text"].startswith("Today I am busy with x")
    assert len(FakeLLM.calls) == 3  # two throttled, then answered
    with pytest.raises(LLMError, match="model 'nobody' or endpoint not found"):
        OpenAICompatibleChat("nobody", base_url=f"{server}/v1", api_key_env="VOICEBIAS_TEST_LLM_KEY").complete(
            msgs, 0, 5
        )
    monkeypatch.setenv("VOICEBIAS_TEST_LLM_KEY", "sk-wrong")
    with pytest.raises(LLMError, match="rejected the API key \\(401\\)"):
        OpenAICompatibleChat("writer-1", base_url=f"{server}/v1", api_key_env="VOICEBIAS_TEST_LLM_KEY").complete(
            msgs, 0, 5
        )
    monkeypatch.delenv("VOICEBIAS_TEST_LLM_KEY")
    monkeypatch.setattr("voicebias.secrets._default_root", lambda: tmp_path)  # no .env there
    with pytest.raises(LLMError, match="set VOICEBIAS_TEST_LLM_KEY"):
        OpenAICompatibleChat("writer-1", base_url=f"{server}/v1", api_key_env="VOICEBIAS_TEST_LLM_KEY")


def test_gemini_backend_speaks_generate_content(server):
    pytest.importorskip("google.genai")
    chat = GeminiChat("gemini-test", api_key_env="VOICEBIAS_TEST_LLM_KEY", base_url=server)
    reply = json.loads(
        chat.complete(
            [{"role": "system", "content": "Rate it."}, {"role": "user", "content": "Passage: hello"}], 0.0, 20
        )
    )
    assert reply == {"echo": "Passage: hello", "system": "Rate it.", "temperature": 0.0}
    (call,) = FakeLLM.calls
    assert re.fullmatch(r"/v1(beta)?/models/gemini-test:generateContent", call["path"])
    assert call["headers"]["x-goog-api-key"] == KEY
    assert call["body"]["generationConfig"]["responseMimeType"] == "application/json"


def test_rating_parser_rejects_what_it_cannot_trust():
    assert (
        parse_rating('{"gender_coding": 6, "pole": "masculine", "naturalness": 4, "speaker_gender_cue": false}')[
            "status"
        ]
        == "ok"
    )
    assert parse_rating("I think it is masculine.")["status"].startswith("invalid")
    assert (
        parse_rating('{"gender_coding": 9, "pole": "masculine", "naturalness": 4, "speaker_gender_cue": false}')[
            "status"
        ]
        == "invalid: value out of range"
    )
    assert (
        parse_rating('{"gender_coding": 5, "pole": "male", "naturalness": 4, "speaker_gender_cue": false}')["status"]
        == "invalid: value out of range"
    )
    assert parse_json_reply('Sure! {"a": {"b": 1}} trailing') == {"a": {"b": 1}}
    assert intensity("masculine", 7) == 1 and intensity("feminine", 1) == 1 and intensity("neutral", 4) == 1


def test_local_transformers_model_without_files_is_a_clear_error(tmp_path):
    with pytest.raises(LLMError, match="no config.json"):
        TransformersChat(str(tmp_path / "missing-model"))


def build_tiny_instruct_model(folder):
    """A 1-layer Llama with a word-level tokenizer and a chat template, saved locally."""
    from tests.fakes.tiny_models import build_tiny_llama

    build_tiny_llama(
        folder,
        [
            "<pad>",
            "<eos>",
            "<unk>",
            "system",
            "user",
            "assistant",
            ":",
            "{",
            "}",
            "gender_coding",
            "pole",
            "masculine",
            "neutral",
            "feminine",
            "1",
            "4",
            "7",
            "passage",
            "rate",
            "it",
        ],
        max_positions=256,
    )


def test_local_transformers_judge_joins_the_panel(server, tmp_path, empty_bank, monkeypatch):
    """A local instruct model (no hub) answers through the same interface; its unusable
    ratings are recorded as invalid and the panel decides on the valid ones."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "tiny-instruct"
    build_tiny_instruct_model(folder)
    chat = TransformersChat(str(folder))
    msgs = [{"role": "system", "content": "rate it"}, {"role": "user", "content": "passage"}]
    assert chat.complete(msgs, 0.0, 6) == chat.complete(msgs, 0.0, 6)
    assert chat.complete(msgs, 1.0, 6, seed=5) == chat.complete(msgs, 1.0, 6, seed=5)
    params = stage_params(server, tmp_path, min_judges=1, judge_max_tokens=12, languages=["en"])
    params["generate"]["judges"] = [
        params["generate"]["judges"][0],
        {"backend": "transformers", "name": "local", "path": str(folder)},
    ]
    run_stage(params, bank_dir=empty_bank, out_dir=tmp_path / "g", metrics_path=tmp_path / "m.json")
    ratings = pd.read_csv(tmp_path / "g" / "ratings.csv")
    local = ratings[ratings["judge"] == "local"]
    assert len(local) == (ratings["judge"] == "a").sum() > 0
    assert local["status"].str.startswith("invalid").all() and local["model"].eq("transformers:tiny-instruct").all()
    sel = pd.read_csv(tmp_path / "g" / "selection.csv")
    assert len(sel) == 6 and (sel["n_judges"] == 1).all()
