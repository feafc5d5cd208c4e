"""Text chat with language models: the OpenAI SDK client and the JSON-reply parser.

Both the bank-extension stage (voicebias.clients.chat backends: writer and judge panel) and the
speech-continuation judge (voicebias.instruments.judge) talk to OpenAI-compatible endpoints through
the pinned ``openai`` SDK (``base_url`` for local servers such as vLLM, llama.cpp or
Ollama; the SDK's own ``max_retries`` retries connection failures, 408, 409, 429 and
5xx with backoff, honouring Retry-After) and read a JSON object out of the reply with
:func:`extract_json_object`. Gemini goes through ``google-genai`` in each module.
"""

from __future__ import annotations

import json
import re
from typing import Any

from voicebias.errors import VoicebiasError

#: The key sent to servers that take none (vLLM, llama.cpp, Ollama); not a secret.
NO_KEY = "EMPTY"


class ChatError(VoicebiasError, RuntimeError):
    """A chat request failed for good: refused, not found, or retries spent.

    `status` is the HTTP status (None when the server was not reached) and `detail`
    the server's message, both for the caller to word its own error.
    """

    def __init__(self, message: str, status: int | None = None, detail: str = ""):
        super().__init__(message)
        self.status, self.detail = status, detail


def openai_client(base_url: str | None, api_key: str | None, timeout_s: float, max_retries: int):
    """An ``openai.OpenAI`` client for `base_url` (the SDK's own retries: `max_retries`).

    The key is passed explicitly (NO_KEY when there is none), so the SDK never falls back
    on OPENAI_API_KEY from the environment for an endpoint configured without one.
    """
    try:
        import openai
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ChatError(
            "the OpenAI-compatible backends need the 'openai' package (pip install openai==3.51.0)"
        ) from exc
    return openai.OpenAI(
        api_key=api_key or NO_KEY, base_url=base_url, timeout=float(timeout_s), max_retries=int(max_retries)
    )


def chat_completion(client: Any, **kwargs: Any) -> tuple[str, str]:
    """(reply text, served model name) of ``client.chat.completions.create(**kwargs)``.

    Raises :class:`ChatError` once the SDK gives up: with the HTTP status for an error
    answer, without one for a connection failure or timeout, or for a reply without text.
    """
    import openai

    try:
        completion = client.chat.completions.create(**kwargs)
    except openai.APIStatusError as exc:
        detail = str(getattr(exc, "message", "") or exc).strip()[:300]
        raise ChatError(f"HTTP {exc.status_code}: {detail}", exc.status_code, detail) from None
    except (openai.APIConnectionError, openai.APITimeoutError) as exc:
        raise ChatError(f"unreachable: {exc}", None, str(exc)) from exc
    try:
        text = completion.choices[0].message.content
    except (AttributeError, IndexError, TypeError):
        text = None
    if text is None:
        raise ChatError("the answer holds no choices[0].message.content", 200)
    return text, str(getattr(completion, "model", "") or kwargs.get("model", ""))


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def extract_json_object(reply: str) -> dict[str, Any]:
    """The first JSON object in a model's reply (code fences and chatter around it are ignored).

    Raises ValueError saying why there is none.
    """
    text = _FENCE.sub("", (reply or "").strip())
    decoder = json.JSONDecoder()
    start, first_error = text.find("{"), None
    while start != -1:
        try:
            obj, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError as exc:
            first_error = first_error or exc.msg
        else:
            if isinstance(obj, dict):
                return obj
        start = text.find("{", start + 1)
    if first_error:
        raise ValueError(f"reply holds no JSON object (it starts one that is not valid JSON: {first_error})")
    raise ValueError("reply holds no JSON object")


def parse_json_reply(reply: str) -> dict[str, Any] | None:
    """:func:`extract_json_object`, or None when the reply holds none."""
    try:
        return extract_json_object(reply)
    except ValueError:
        return None
