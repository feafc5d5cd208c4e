"""Chat backends for the LLM steps (the passage writer and raters, the continuation judge):
OpenAI-compatible servers, Gemini and local transformers models, one factory over params
entries and an on-disk reply cache."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from voicebias.cache import JsonCache, content_key
from voicebias.clients.llm import ChatError, chat_completion, openai_client
from voicebias.errors import VoicebiasError
from voicebias.registry import Registry
from voicebias.secrets import read_secret, redact


class LLMError(VoicebiasError, RuntimeError):
    """An LLM backend could not be reached or refused the request; the message says why."""


# ------------------------------------------------------------------ backends


def _key(env_name: str | None, who: str) -> str | None:
    if not env_name:
        return None
    key = read_secret(env_name)
    if not key:
        raise LLMError(f"{who} needs an API key: set {env_name} in the environment or in .env")
    return key


class ChatBackend(ABC):
    """Turns a list of chat messages ({'role', 'content'}) into the assistant's reply text."""

    kind = "chat"

    def __init__(self, model: str):
        self.model = model

    @abstractmethod
    def complete(
        self, messages: list[dict[str, str]], temperature: float, max_tokens: int, seed: int | None = None
    ) -> str:
        """The reply to `messages` (system, user, ...) as plain text."""

    def describe(self) -> str:
        return f"{self.kind}:{self.model}"


class OpenAICompatibleChat(ChatBackend):
    """Chat completions at {base_url} (OpenAI, vLLM, llama.cpp server, Ollama, ...) through the openai SDK.

    The SDK retries connection failures, 429 and 5xx up to `max_retries` times with its
    own backoff, honouring Retry-After; `retry_wait_s` is the REST backends' setting and
    does not apply here. Without `api_key_env` the placeholder key 'EMPTY' is sent.
    """

    kind = "openai"

    def __init__(
        self,
        model: str,
        base_url: str = "https://api.openai.com/v1",
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout_s: float = 120.0,
        max_retries: int = 4,
        retry_wait_s: float = 2.0,
        json_mode: bool = True,
    ):
        super().__init__(model)
        self.base_url = base_url.rstrip("/")
        self.key = _key(api_key_env, f"the OpenAI-compatible endpoint {self.base_url}")
        self.timeout_s, self.max_retries, self.retry_wait_s = float(timeout_s), int(max_retries), float(retry_wait_s)
        self.json_mode = bool(json_mode)
        self.client = openai_client(self.base_url, self.key, self.timeout_s, self.max_retries)

    def complete(self, messages, temperature, max_tokens, seed=None):
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        if seed is not None:
            kwargs["seed"] = int(seed)
        if self.json_mode:
            kwargs["response_format"] = {"type": "json_object"}
        url = f"{self.base_url}/chat/completions"
        try:
            return chat_completion(self.client, **kwargs)[0]
        except ChatError as exc:
            detail = redact(exc.detail or str(exc), [self.key])
            if exc.status is None:
                raise LLMError(f"{url} unreachable: {detail}") from None
            if exc.status == 200:
                raise LLMError(f"{url} answered 200 without choices[0].message.content") from None
            if exc.status in (401, 403):
                raise LLMError(f"{url} rejected the API key ({exc.status}): {detail}") from None
            if exc.status == 404:
                raise LLMError(f"{url}: model '{self.model}' or endpoint not found (404): {detail}") from None
            raise LLMError(f"{url} failed ({exc.status}): {detail}") from None

    def describe(self):
        return f"openai:{self.model}@{self.base_url}"


class GeminiChat(ChatBackend):
    """Google Gemini through google-genai's generate_content."""

    kind = "gemini"

    def __init__(
        self, model: str, api_key_env: str = "GEMINI_API_KEY", base_url: str | None = None, json_mode: bool = True
    ):
        super().__init__(model)
        key = _key(api_key_env, "the Gemini backend")
        try:
            from google import genai
            from google.genai import types
        except ImportError as exc:
            raise LLMError(
                "the Gemini backend needs the 'google-genai' package (pip install google-genai==3.3.0)"
            ) from exc
        self._types = types
        http = types.HttpOptions(base_url=base_url) if base_url else None
        self.client = genai.Client(api_key=key, http_options=http)
        self.json_mode = bool(json_mode)

    def complete(self, messages, temperature, max_tokens, seed=None):
        t = self._types
        system = "\n\n".join(m["content"] for m in messages if m["role"] == "system") or None
        contents = [
            t.Content(role="model" if m["role"] == "assistant" else "user", parts=[t.Part(text=m["content"])])
            for m in messages
            if m["role"] != "system"
        ]
        config = t.GenerateContentConfig(
            system_instruction=system,
            temperature=temperature,
            max_output_tokens=max_tokens,
            seed=seed,
            response_mime_type="application/json" if self.json_mode else None,
        )
        try:
            resp = self.client.models.generate_content(model=self.model, contents=contents, config=config)
        except Exception as exc:  # the SDK raises its own error classes; keep the message
            raise LLMError(f"Gemini '{self.model}' failed: {exc}") from exc
        return resp.text or ""


class TransformersChat(ChatBackend):
    """A local instruct model folder (config, weights, tokenizer with a chat template)."""

    kind = "transformers"

    def __init__(self, path: str, device: str = "cpu", model: str | None = None):
        from voicebias.config import ROOT

        folder = Path(path) if Path(path).is_absolute() else ROOT / path
        if not (folder / "config.json").is_file():
            raise LLMError(
                f"local model folder {folder} has no config.json: put the instruct model's files there "
                "(fetched on a machine with internet and tracked with DVC)"
            )
        super().__init__(model or folder.name)
        self.folder, self.device = folder, device
        self._tok = self._lm = None

    def _load(self):
        if self._lm is None:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(str(self.folder), local_files_only=True)
            if not getattr(self._tok, "chat_template", None):
                raise LLMError(f"{self.folder}: the tokenizer has no chat template, so it is not an instruct model")
            self._lm = (
                AutoModelForCausalLM.from_pretrained(str(self.folder), local_files_only=True).to(self.device).eval()
            )
        return self._tok, self._lm

    def complete(self, messages, temperature, max_tokens, seed=None):
        import torch

        tok, lm = self._load()
        inputs = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, return_tensors="pt")
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        if seed is not None:
            torch.manual_seed(int(seed))
        sample = temperature > 0
        with torch.no_grad():
            out = lm.generate(
                **inputs,
                max_new_tokens=max_tokens,
                do_sample=sample,
                temperature=temperature if sample else None,
                top_p=None,
                top_k=None,
                pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            )
        return tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)

    def describe(self):
        return f"transformers:{self.folder.name}"


BACKENDS = Registry(
    "LLM backend",
    {
        "openai": "voicebias.clients.chat:OpenAICompatibleChat",
        "gemini": "voicebias.clients.chat:GeminiChat",
        "transformers": "voicebias.clients.chat:TransformersChat",
    },
)


def make_chat(spec: dict[str, Any]) -> ChatBackend:
    """A backend from a params entry: {backend: openai|gemini|transformers, model/path, ...}."""
    spec = {k: v for k, v in spec.items() if v is not None}  # unset: the backend's own default
    kind = spec.pop("backend", None)
    spec.pop("name", None)
    spec.pop("temperature", None)
    return BACKENDS.get(kind)(**spec)


class CachedChat:
    """Wraps a backend with an on-disk reply cache; sampled replies are keyed by their seed."""

    def __init__(self, backend: ChatBackend, cache_dir: Path):
        self.backend, self.cache_dir = backend, Path(cache_dir)
        self.cache = JsonCache(self.cache_dir, shard=2, check=lambda v: isinstance(v, dict) and "reply" in v)
        self.calls = 0

    def complete(self, messages, temperature: float, max_tokens: int, seed: int | None = None) -> str:
        key = content_key(
            {
                "backend": self.backend.describe(),
                "messages": messages,
                "temperature": temperature,
                "max_tokens": max_tokens,
                "seed": seed,
            }
        )
        hit = self.cache.get(key)
        if hit is not None:
            return hit["reply"]
        reply = self.backend.complete(messages, temperature, max_tokens, seed)
        self.calls += 1
        self.cache.put(key, {"backend": self.backend.describe(), "reply": reply})
        return reply
