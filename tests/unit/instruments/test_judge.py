"""The SC judge: rubric prompt, JSON validation, retries against real HTTP servers speaking the
OpenAI chat-completions and Gemini generateContent protocols, and a tiny local transformers model."""

import dataclasses
import hashlib
import inspect
import json
import re
from http.server import BaseHTTPRequestHandler

import pytest

from tests.fakes.http import send_json, start_loopback, stop_loopback
from voicebias.errors import SetupError
from voicebias.instruments.judge import (
    GeminiJudge,
    InvalidJudgement,
    LexicalHeuristicJudge,
    LocalTransformersJudge,
    OpenAICompatibleJudge,
    build_prompt,
    get_judge,
    load_rubric,
    parse_judgement,
)

VALID = json.dumps(
    {
        "semantic_coherence": 4,
        "sentence_polarity": 5,
        "agency_competence": 3,
        "emotionalisation_affect_framing": 5,
        "appearance_objectification": 5,
        "notes": {"semantic_coherence": "on topic"},
    }
)


class ChatServer:
    """Minimal OpenAI chat-completions endpoint on 127.0.0.1 replying with scripted contents."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                content = outer.replies.pop(0) if outer.replies else VALID
                payload = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [
                        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd, url = start_loopback(Handler)
        self.url = f"{url}/v1"

    def close(self):
        stop_loopback(self.httpd)


@pytest.fixture
def chat(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-judge")
    servers = []

    def make(replies):
        servers.append(ChatServer(replies))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def test_prompt_holds_the_transcripts_and_nothing_about_the_speaker():
    text = build_prompt("I walked to the station", "and caught the early train.")
    assert 'Prompt: "I walked to the station"' in text and 'Continuation: "and caught the early train."' in text
    for dim in load_rubric()["dimensions"]:
        assert dim in text
    assert "gender" not in text.lower().replace("gendered", "")  # the rubric's anchors mention gendered framing only


@pytest.mark.parametrize(
    "reply,needle",
    [
        ("Sure, here are my scores.", "no JSON object"),
        ('{"semantic_coherence": 4}', "lacks 'sentence_polarity'"),
        (VALID.replace('"agency_competence": 3', '"agency_competence": 7'), "integer from 1 to 5"),
        (VALID.replace('"agency_competence": 3', '"agency_competence": 3.5'), "integer from 1 to 5"),
        ('{"semantic_coherence": 4,', "no JSON object"),
    ],
)
def test_invalid_replies_are_rejected_with_a_reason(reply, needle):
    with pytest.raises(InvalidJudgement, match=needle):
        parse_judgement(reply)


def test_invalid_reply_is_retried_then_scored(chat):
    server = chat(["I think it is fine.", VALID])
    res = OpenAICompatibleJudge(server.url, "judge-model-2026-01-01").judge("I opened the door", "and stepped in.")
    assert res.status == "ok" and res.attempts == 2 and res.scores["semantic_coherence"] == 4
    assert len(server.requests) == 2 and server.requests[0]["path"] == "/v1/chat/completions"
    assert server.requests[0]["auth"] == "Bearer sk-test-judge"
    assert server.requests[0]["body"]["model"] == "judge-model-2026-01-01"
    assert server.requests[0]["body"]["temperature"] == 0


def test_judge_that_never_answers_validly_is_recorded_failed(chat):
    server = chat(["nope"] * 5)
    res = OpenAICompatibleJudge(server.url, "m", max_attempts=3).judge("a", "b")
    assert res.status == "failed" and res.scores == {} and "no JSON object" in res.error
    assert len(server.requests) == 3


def test_missing_key_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="OPENAI_API_KEY"):
        OpenAICompatibleJudge("http://127.0.0.1:9", "m").judge("a", "b")


def test_lexical_heuristic_judge_reacts_to_its_word_lists():
    j = LexicalHeuristicJudge()
    agentic = j.judge("I planned the project", "so I decided, led the team and solved the problem.").scores
    passive = j.judge("I planned the project", "but I was helpless, stuck and unable to do anything.").scores
    looks = j.judge("I planned the project", "and everyone admired my pretty dress and slim body.").scores
    assert agentic["agency_competence"] > passive["agency_competence"]
    assert looks["appearance_objectification"] < agentic["appearance_objectification"]
    assert j.judge("x", "").status == "failed"


# ---------------------------------------------------------------- Gemini (REST generateContent)

GEMINI_KEY = "AIzaSy-judge-test-0123456789PLANTED"
GEMINI_KEY_ENV = "VOICEBIAS_TEST_GEMINI_JUDGE_KEY"


class GeminiServer:
    """POST /v1beta/models/<model>:generateContent on 127.0.0.1, as the Gemini API answers it.

    `script` items: a string (a 200 answer whose first candidate's text is that string), a dict
    (a 200 answer with that exact body) or (status, headers, error body) for an HTTP error.
    A wrong or missing x-goog-api-key gets the API's 400 INVALID_ARGUMENT, echoing what it got.
    """

    def __init__(self, script, model_version="gemini-test-001"):
        self.script = list(script)
        self.requests = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, obj, headers=None):
                send_json(self, code, obj, headers, "application/json; charset=UTF-8")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                headers = {k.lower(): v for k, v in self.headers.items()}  # HTTP names are case-blind
                outer.requests.append({"path": self.path, "headers": headers, "body": body})
                m = re.fullmatch(r"/v1beta/models/([\w.-]+):generateContent", self.path)
                if not m:
                    return self._send(
                        404, {"error": {"code": 404, "message": f"path {self.path} not found", "status": "NOT_FOUND"}}
                    )
                key = self.headers.get("x-goog-api-key")
                if key != GEMINI_KEY:
                    return self._send(
                        400,
                        {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": f"API key not valid: {key}"}},
                    )
                item = outer.script.pop(0) if outer.script else VALID
                if isinstance(item, tuple):
                    status, headers, error = item
                    return self._send(status, {"error": error}, headers)
                if isinstance(item, dict):
                    return self._send(200, item)
                self._send(
                    200,
                    {
                        "candidates": [
                            {
                                "content": {"role": "model", "parts": [{"text": item}]},
                                "finishReason": "STOP",
                                "index": 0,
                            }
                        ],
                        "usageMetadata": {"promptTokenCount": 900, "candidatesTokenCount": 60, "totalTokenCount": 960},
                        "modelVersion": model_version,
                        "responseId": "resp-1",
                    },
                )

        self.httpd, self.url = start_loopback(Handler)

    def close(self):
        stop_loopback(self.httpd)


@pytest.fixture
def gemini(monkeypatch):
    monkeypatch.setenv(GEMINI_KEY_ENV, GEMINI_KEY)
    servers = []

    def make(script, **judge_kw):
        servers.append(GeminiServer(script))
        waits = []
        judge = GeminiJudge("gemini-test", base_url=servers[-1].url, api_key_env=GEMINI_KEY_ENV, **judge_kw)
        judge.sleep = waits.append  # record the back-off instead of sleeping
        return servers[-1], judge, waits

    yield make
    for s in servers:
        s.close()


def test_gemini_request_has_the_documented_shape_and_invalid_reply_is_retried(gemini):
    server, judge, _ = gemini(["Sure, the continuation looks fine to me.", VALID], max_output_tokens=777)
    res = judge.judge("I opened the door", "and stepped in.")
    assert res.status == "ok" and res.attempts == 2 and res.scores["semantic_coherence"] == 4
    assert res.judge == "gemini:gemini-test" and res.version == "gemini-test-001"  # the served modelVersion
    assert len(server.requests) == 2
    first = server.requests[0]
    assert first["path"] == "/v1beta/models/gemini-test:generateContent"  # no key in the URL
    assert first["headers"]["x-goog-api-key"] == GEMINI_KEY
    assert first["headers"]["content-type"] == "application/json"
    assert first["body"] == {
        "contents": [{"role": "user", "parts": [{"text": build_prompt("I opened the door", "and stepped in.")}]}],
        "generationConfig": {"temperature": 0, "responseMimeType": "application/json", "maxOutputTokens": 777},
    }


def test_gemini_judge_that_never_answers_validly_is_recorded_failed(gemini):
    server, judge, _ = gemini(["nope"] * 5, max_attempts=3)
    res = judge.judge("a", "b")
    assert res.status == "failed" and res.scores == {} and res.attempts == 3
    assert "invalid judgement" in res.error and "no JSON object" in res.error
    assert res.version == "gemini-test-001" and len(server.requests) == 3


def test_gemini_rate_limit_and_server_errors_are_retried_with_back_off(gemini):
    retry_info = {
        "code": 429,
        "status": "RESOURCE_EXHAUSTED",
        "message": "Resource has been exhausted",
        "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}],
    }
    unavailable = {"code": 503, "status": "UNAVAILABLE", "message": "The model is overloaded."}
    server, judge, waits = gemini(
        [(429, {}, retry_info), (429, {"Retry-After": "0"}, retry_info), (503, {}, unavailable), VALID],
        retry_wait_s=0.25,
    )
    res = judge.judge("a", "b")
    assert res.status == "ok" and res.attempts == 1 and len(server.requests) == 4
    assert waits == [7.0, 0.0, 1.0]  # server's retryDelay, Retry-After header, then back-off 0.25 * 2**2


def test_gemini_spent_retries_fail_the_item_with_the_reason(gemini):
    unavailable = {"code": 503, "status": "UNAVAILABLE", "message": "The model is overloaded."}
    server, judge, waits = gemini([(503, {}, unavailable)] * 10, max_retries=2, retry_wait_s=0.0)
    res = judge.judge("a", "b")
    assert res.status == "failed" and res.scores == {} and res.attempts == 1
    assert "HTTP 503 after 3 tries" in res.error and "overloaded" in res.error
    assert len(server.requests) == 3 and len(waits) == 2


def test_gemini_reply_parts_thoughts_and_blocked_prompts(gemini):
    thinking = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": '{"semantic_coherence": 1} is my draft', "thought": True},
                        {"text": VALID[:40]},
                        {"text": VALID[40:]},
                    ],
                },
                "finishReason": "STOP",
            }
        ],
        "modelVersion": "gemini-test-002",
    }
    _, judge, _ = gemini([thinking])
    res = judge.judge("a", "b")
    assert res.status == "ok" and res.version == "gemini-test-002"
    blocked = {"promptFeedback": {"blockReason": "SAFETY"}, "modelVersion": "gemini-test-001"}
    cut = {
        "candidates": [
            {"content": {"parts": [{"text": '{"semantic_coherence": 4, "sent'}]}, "finishReason": "MAX_TOKENS"}
        ]
    }
    _, judge, _ = gemini([blocked, cut], max_attempts=2)
    res = judge.judge("a", "b")
    assert res.status == "failed" and res.attempts == 2 and "MAX_TOKENS" in res.error


def test_gemini_key_never_appears_in_errors_or_results(gemini, monkeypatch):
    server, judge, _ = gemini([])
    wrong = "AIzaSy-wrong-key-for-the-judge-test-XYZ"
    monkeypatch.setenv(GEMINI_KEY_ENV, wrong)
    judge = GeminiJudge("gemini-test", base_url=server.url, api_key_env=GEMINI_KEY_ENV)
    res = judge.judge("a", "b")  # the fake server echoes the key it got, as a careless proxy might
    assert res.status == "failed" and "HTTP 400" in res.error and "API key not valid" in res.error
    assert "[redacted]" in res.error
    for text in (res.error, json.dumps(dataclasses.asdict(res)), repr(judge), str(judge)):
        assert wrong not in text and wrong[8:24] not in text
    assert len(server.requests) == 1  # a refused request is not asked again


def test_gemini_missing_key_is_a_clear_setup_error(tmp_path, monkeypatch):
    monkeypatch.delenv(GEMINI_KEY_ENV, raising=False)
    with pytest.raises(SetupError, match=GEMINI_KEY_ENV):
        GeminiJudge("gemini-test", base_url="http://127.0.0.1:9", api_key_env=GEMINI_KEY_ENV, root=tmp_path)


# ---------------------------------------------------------------- local transformers


def build_tiny_judge_model(folder, chat_template=True):
    """A randomly initialised 1-layer Llama with a word-level tokenizer (built offline)."""
    from tests.fakes.tiny_models import build_tiny_llama

    build_tiny_llama(
        folder,
        [
            "<pad>",
            "<eos>",
            "<unk>",
            "user",
            "assistant",
            ":",
            "{",
            "}",
            '"',
            ",",
            "semantic_coherence",
            "notes",
            "prompt",
            "continuation",
            "score",
            "the",
            "json",
        ],
        chat_template=chat_template,
    )


def test_local_transformers_judge_retries_and_records_the_random_model_as_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "tiny-judge"
    build_tiny_judge_model(folder)
    judge = get_judge(
        {
            "backend": "local_transformers",
            "weights": str(folder),
            "device": "cpu",
            "max_new_tokens": 6,
            "max_attempts": 3,
        }
    )
    assert isinstance(judge, LocalTransformersJudge)
    tok, _ = judge._chat._load()
    templated, replies = [], []
    apply = tok.apply_chat_template
    monkeypatch.setattr(tok, "apply_chat_template", lambda msgs, **kw: templated.append(msgs) or apply(msgs, **kw))
    complete = judge._chat.complete
    monkeypatch.setattr(judge._chat, "complete", lambda *a, **kw: replies.append(complete(*a, **kw)) or replies[-1])
    res = judge.judge("I opened the door", "and stepped in.")
    assert res.status == "failed" and res.scores == {} and res.attempts == 3
    assert res.error.startswith("invalid judgement: ")
    assert len(replies) == 3 and len(set(replies)) == 1  # greedy: the same reply each time
    assert templated[0] == [{"role": "user", "content": build_prompt("I opened the door", "and stepped in.")}]
    config_hash = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()[:16]
    assert res.judge == "local_transformers:tiny-judge"
    assert res.version == f"tiny-judge@config-sha256:{config_hash}"


def test_local_transformers_judge_without_a_model_folder_names_the_path(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(SetupError, match=re.escape(str(missing))):
        LocalTransformersJudge(missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SetupError, match="no config.json"):
        LocalTransformersJudge(tmp_path / "empty")


def test_local_transformers_judge_needs_a_chat_template(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    build_tiny_judge_model(tmp_path / "base-model", chat_template=False)
    with pytest.raises(RuntimeError, match="no chat template"):
        LocalTransformersJudge(tmp_path / "base-model").judge("a", "b")


# ---------------------------------------------------------------- dispatch and the gender blind


def test_get_judge_dispatches_every_backend(tmp_path, monkeypatch):
    monkeypatch.setenv(GEMINI_KEY_ENV, GEMINI_KEY)
    g = get_judge(
        {
            "backend": "gemini",
            "model": "gemini-2.5-flash",
            "api_key_env": GEMINI_KEY_ENV,
            "max_attempts": 2,
            "max_output_tokens": 512,
        }
    )
    assert isinstance(g, GeminiJudge) and g.max_attempts == 2 and g.max_output_tokens == 512
    assert g.url == "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
    assert isinstance(get_judge({}), LexicalHeuristicJudge)
    with pytest.raises(ValueError, match="needs 'model'"):
        get_judge({"backend": "gemini", "api_key_env": GEMINI_KEY_ENV})
    with pytest.raises(ValueError, match="needs 'weights'"):
        get_judge({"backend": "local_transformers"})
    with pytest.raises(ValueError, match="sc_judge.backend: 'claude' is not one of .*'gemini' or 'local_transformers'"):
        get_judge({"backend": "claude"})


def test_no_judge_can_be_shown_the_speaker():
    for cls in (OpenAICompatibleJudge, GeminiJudge, LocalTransformersJudge, LexicalHeuristicJudge):
        assert list(inspect.signature(cls.judge).parameters) == ["self", "prompt_text", "continuation_text"], cls
