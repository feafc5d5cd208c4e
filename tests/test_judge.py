"""The SC judge: rubric prompt, JSON validation, retries against a real HTTP chat-completions server."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from voicebias.judge import (InvalidJudgement, LexicalHeuristicJudge, OpenAICompatibleJudge, build_prompt,
                             load_rubric, parse_judgement)

VALID = json.dumps({"semantic_coherence": 4, "sentence_polarity": 5, "agency_competence": 3,
                    "emotionalisation_affect_framing": 5, "appearance_objectification": 5,
                    "notes": {"semantic_coherence": "on topic"}})


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
                payload = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": content}}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()


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


@pytest.mark.parametrize("reply,needle", [
    ("Sure, here are my scores.", "no JSON object"),
    ('{"semantic_coherence": 4}', "lacks 'sentence_polarity'"),
    (VALID.replace('"agency_competence": 3', '"agency_competence": 7'), "integer from 1 to 5"),
    (VALID.replace('"agency_competence": 3', '"agency_competence": 3.5'), "integer from 1 to 5"),
    ('{"semantic_coherence": 4,', "no JSON object"),
])
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
