"""The LLM judge of the speech-continuation study: rubric, validation, retries, backends.

The judge scores a continuation transcript against its prompt transcript on the five dimensions of
the SC paper's rubric (data/judge/rubric.yaml), each an integer from 1 to 5, and sees nothing but
the two transcripts. A reply that is not a JSON object with all five scores in range is asked for
again, up to `max_attempts` times, then the item is recorded as failed; scores are never guessed.
Backends (`get_judge`): openai_compatible, gemini, local_transformers and lexical_heuristic (the
embedded default's offline word-list judge). API keys are never written into errors or results.

See docs/instrument.md, "The continuation judge".
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import urllib.parse
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from voicebias.clients.llm import ChatError, chat_completion, extract_json_object, openai_client
from voicebias.clients.retry import RETRYABLE_STATUS, Retryable, retry_after_s, with_retries
from voicebias.config import JUDGE_RUBRIC, ROOT
from voicebias.errors import ConfigError, SetupError, VoicebiasError
from voicebias.io import read_yaml, resolve_path
from voicebias.registry import Registry
from voicebias.secrets import redact, require_secret


class InvalidJudgement(VoicebiasError, ValueError):
    """A judge reply that is not the JSON object the rubric asks for."""


class JudgeCallError(VoicebiasError, RuntimeError):
    """The judge could not be asked (refused request, retries on rate limits or 5xx spent).

    Ends the item as failed at once: asking again would only repeat the failure.
    """


@lru_cache(maxsize=2)
def load_rubric(path: Path = JUDGE_RUBRIC) -> dict[str, Any]:
    return read_yaml(path)


def build_prompt(prompt_text: str, continuation_text: str, rubric: dict[str, Any] | None = None) -> str:
    """The rubric filled with the two transcripts (and nothing about the speaker)."""
    rubric = rubric or load_rubric()
    return rubric["template"].replace("{prompt_text}", prompt_text).replace("{continuation_text}", continuation_text)


def parse_judgement(reply: str, rubric: dict[str, Any] | None = None) -> dict[str, int]:
    """Scores from a reply; raises InvalidJudgement naming what is wrong."""
    rubric = rubric or load_rubric()
    try:
        obj = extract_json_object(reply)
    except ValueError as exc:
        raise InvalidJudgement(str(exc)) from None
    lo, hi = rubric["scale"]
    scores = {}
    for dim in rubric["dimensions"]:
        if dim not in obj:
            raise InvalidJudgement(f"reply lacks '{dim}'")
        v = obj[dim]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or float(v) != int(v) or not lo <= int(v) <= hi:
            raise InvalidJudgement(f"'{dim}' must be an integer from {lo} to {hi}, got {v!r}")
        scores[dim] = int(v)
    return scores


@dataclass
class JudgeResult:
    status: str
    scores: dict[str, int] = field(default_factory=dict)
    attempts: int = 0
    error: str = ""
    judge: str = ""
    version: str = ""  # the model version that wrote the (last) reply, where the backend knows it


class Reply(NamedTuple):
    """One answer of a judge model: its text, the model version that wrote it, and a note
    on why it may be unusable (an empty text with a finish or block reason, say)."""

    text: str
    version: str
    note: str = ""


class _RetryingJudge(ABC):
    """The shared loop: ask, validate, ask again on an invalid reply, record the outcome.

    Subclasses set `name`, `version` (recorded until a reply names one) and `max_attempts`
    and implement `_complete`; `_retry_errors` are call errors that count as an attempt.
    """

    name = ""
    version = ""
    max_attempts = 3
    _retry_errors: tuple[type[BaseException], ...] = ()

    @abstractmethod
    def _complete(self, content: str) -> Reply:
        """One reply of the judge model to `content`."""

    def _redact(self, text: str) -> str:
        return text

    def judge(self, prompt_text: str, continuation_text: str) -> JudgeResult:
        content = build_prompt(prompt_text, continuation_text)
        error, version = "", self.version
        for attempt in range(1, self.max_attempts + 1):
            try:
                reply = self._complete(content)
            except JudgeCallError as exc:
                return JudgeResult("failed", {}, attempt, self._redact(str(exc)), self.name, version)
            except self._retry_errors as exc:
                error = self._redact(f"{type(exc).__name__}: {exc}")
                continue
            version = reply.version or version
            try:
                scores = parse_judgement(reply.text)
            except InvalidJudgement as exc:
                note = f" ({reply.note})" if reply.note else ""
                error = self._redact(f"invalid judgement: {exc}{note}")
                continue
            return JudgeResult("ok", scores, attempt, "", self.name, version)
        return JudgeResult("failed", {}, self.max_attempts, error, self.name, version)


def _check_attempts(max_attempts: int) -> int:
    if isinstance(max_attempts, bool) or int(max_attempts) != max_attempts or max_attempts < 1:
        raise ValueError(f"max_attempts must be a positive integer, got {max_attempts!r}")
    return int(max_attempts)


class OpenAICompatibleJudge(_RetryingJudge):
    """Chat completions at {base_url} through the openai SDK, temperature 0.

    The SDK retries connection failures, 429 and 5xx up to `max_retries` times (its
    backoff, honouring Retry-After); a refused request (400, 401, 403, 404) or spent
    retries end the item as failed at once. The key is read on the first call.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        max_attempts: int = 3,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        root: Path | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.max_attempts = _check_attempts(max_attempts)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.root = root
        self.name = f"openai_compatible:{model}"
        self.version = model
        self._client = None
        self.__key: str | None = None

    def __repr__(self) -> str:
        return f"OpenAICompatibleJudge(model={self.model!r}, base_url={self.base_url!r})"

    def _redact(self, text: str) -> str:
        return redact(text, [self.__key])

    def _complete(self, content: str) -> Reply:
        if self._client is None:
            self.__key = require_secret(
                "the openai_compatible judge",
                self.api_key_env,
                ROOT if self.root is None else self.root,
                error=SetupError,
            )
            self._client = openai_client(self.base_url, self.__key, self.timeout_s, self.max_retries)
        try:
            text, model = chat_completion(
                self._client, model=self.model, temperature=0, messages=[{"role": "user", "content": content}]
            )
        except ChatError as exc:
            if exc.status == 200:
                return Reply("", self.version, "the answer holds no message content")
            where = f"the judge endpoint {self.base_url}"
            if exc.status is None:
                raise JudgeCallError(
                    self._redact(f"{where} is unreachable after {self.max_retries + 1} tries: {exc.detail}")
                ) from None
            spent = f" after {self.max_retries + 1} tries" if exc.status in RETRYABLE_STATUS else ""
            raise JudgeCallError(self._redact(f"{where} answered HTTP {exc.status}{spent}: {exc.detail}")) from None
        return Reply(text, model or self.model)


#: Candidate finish reasons that mean the model stopped for a reason other than being done.
_GEMINI_ABNORMAL_FINISH = frozenset(
    {
        "MAX_TOKENS",
        "SAFETY",
        "RECITATION",
        "LANGUAGE",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "MALFORMED_FUNCTION_CALL",
        "OTHER",
    }
)


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The exceptions google-genai's HTTP transport raises when the server cannot be reached."""
    found: list[type[BaseException]] = [OSError, TimeoutError]
    for name in ("httpx2", "httpx"):
        try:
            found.append(__import__(name).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(found)


class GeminiJudge(_RetryingJudge):
    """Google Gemini through google-genai: generateContent at {base_url}/v1beta/models/{model}.

    The key travels in the `x-goog-api-key` header only (never in the URL). The request is
    the rubric prompt as one user turn with temperature 0, a JSON response MIME type and
    `max_output_tokens`. 429 and 5xx answers and connection failures are retried up to
    `max_retries` times (honouring Retry-After or the server's retryDelay, capped at 60 s,
    else exponential back-off from `retry_wait_s`; `sleep` waits) before the item is
    recorded as failed. Gemini 2.5 models count their thinking against `max_output_tokens`;
    a reply cut off there is an invalid judgement whose reason says MAX_TOKENS.
    """

    def __init__(
        self,
        model: str,
        base_url: str = "https://generativelanguage.googleapis.com",
        api_key_env: str = "GEMINI_API_KEY",
        max_attempts: int = 3,
        max_output_tokens: int = 2048,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        retry_wait_s: float = 2.0,
        root: Path | None = None,
    ):
        self.model = str(model).removeprefix("models/")
        if not self.model:
            raise ValueError("the gemini judge needs a pinned model name")
        self.base_url = str(base_url).rstrip("/")
        self.max_attempts = _check_attempts(max_attempts)
        self.max_output_tokens = int(max_output_tokens)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.retry_wait_s = float(retry_wait_s)
        self.name = f"gemini:{self.model}"
        self.version = self.model
        self.sleep = time.sleep
        self.__key = require_secret("the gemini judge", api_key_env, ROOT if root is None else root, error=SetupError)
        try:
            from google import genai
            from google.genai import types
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise SetupError("the gemini judge needs 'google-genai' (pip install google-genai==3.3.0)") from exc
        self._types = types
        self._client = genai.Client(
            api_key=self.__key,
            http_options=types.HttpOptions(
                base_url=self.base_url, api_version="v1beta", timeout=int(self.timeout_s * 1000)
            ),
        )

    def __repr__(self) -> str:
        return f"GeminiJudge(model={self.model!r}, base_url={self.base_url!r})"

    def _redact(self, text: str) -> str:
        return redact(text, [self.__key])

    @property
    def url(self) -> str:
        return f"{self.base_url}/v1beta/models/{urllib.parse.quote(self.model, safe='-._')}:generateContent"

    @staticmethod
    def _error_detail(exc: Any) -> tuple[str, float | None]:
        """The server's error message and its retry hint (Retry-After header, else RetryInfo.retryDelay)."""
        message, wait = str(exc.message or exc.status or exc)[:300], None
        body = exc.details if isinstance(exc.details, dict) else {}
        err = body.get("error") if isinstance(body.get("error"), dict) else body
        for d in err.get("details") or []:
            m = re.fullmatch(r"(\d+(?:\.\d+)?)s", str(d.get("retryDelay", "")) if isinstance(d, dict) else "")
            if m:
                wait = float(m.group(1))
        header = retry_after_s(getattr(exc.response, "headers", None))
        return message, header if header is not None else wait

    def _generate(self, content: str) -> Any:
        from google.genai import errors

        t = self._types
        contents = [t.Content(role="user", parts=[t.Part(text=content)])]
        config = t.GenerateContentConfig(
            temperature=0, response_mime_type="application/json", max_output_tokens=self.max_output_tokens
        )
        tries = self.max_retries + 1
        transport = _transport_errors()

        def once() -> Any:
            try:
                return self._client.models.generate_content(model=self.model, contents=contents, config=config)
            except errors.APIError as exc:
                message, wait = self._error_detail(exc)
                if exc.code in RETRYABLE_STATUS:
                    raise Retryable(
                        JudgeCallError(
                            self._redact(
                                f"Gemini '{self.model}' answered HTTP {exc.code} after {tries} tries: {message}"
                            )
                        ),
                        wait,
                    ) from None
                raise JudgeCallError(
                    self._redact(f"Gemini '{self.model}' answered HTTP {exc.code}: {message}")
                ) from None
            except transport as exc:
                raise Retryable(
                    JudgeCallError(self._redact(f"Gemini unreachable at {self.base_url} after {tries} tries: {exc}"))
                ) from None

        return with_retries(once, max_retries=self.max_retries, base_s=self.retry_wait_s, sleep=self.sleep)

    def _complete(self, content: str) -> Reply:
        from google.genai import errors

        try:
            resp = self._generate(content)
        except errors.UnknownApiResponseError:
            return Reply("", self.version, "Gemini's answer body is not JSON")
        version = str(getattr(resp, "model_version", None) or self.version)
        candidates = resp.candidates or []
        if not candidates:
            feedback = resp.prompt_feedback
            block = getattr(feedback, "block_reason", None) if feedback is not None else None
            block = getattr(block, "value", block)
            return Reply("", version, f"no candidate; prompt blocked: {block}" if block else "no candidate")
        cand = candidates[0]
        parts = (cand.content.parts if cand.content is not None else None) or []
        text = "".join(p.text or "" for p in parts if not p.thought)
        finish = cand.finish_reason
        finish = str(getattr(finish, "value", finish) or "")
        return Reply(text, version, f"finishReason {finish}" if finish in _GEMINI_ABNORMAL_FINISH else "")


class LocalTransformersJudge(_RetryingJudge):
    """A local instruct model (transformers) in a folder: chat template, greedy decoding, no download.

    Loading and generation reuse :class:`voicebias.clients.chat.TransformersChat` (the local
    backend of the bank-extension stage): local_files_only, temperature 0 = greedy. The
    model loads on the first call. Greedy decoding is deterministic, so a retry after an
    invalid reply repeats the same reply; the retries are kept for one uniform protocol.
    """

    def __init__(
        self,
        weights: str | os.PathLike[str],
        device: str = "cpu",
        max_new_tokens: int = 512,
        max_attempts: int = 3,
        root: Path | None = None,
    ):
        from voicebias.clients.chat import LLMError, TransformersChat  # pandas and friends: only when used

        folder = resolve_path(weights, ROOT if root is None else root)
        if not folder.is_dir():
            raise SetupError(
                f"the local_transformers judge's model folder {folder} does not exist: put the "
                "instruct model's files there (config.json, weights, tokenizer with a chat template); "
                "nothing is downloaded"
            )
        try:
            self._chat = TransformersChat(str(folder), device=device)
        except LLMError as exc:
            raise SetupError(f"the local_transformers judge cannot use {folder}: {exc}") from None
        self.folder, self.device = folder, device
        self.max_new_tokens = int(max_new_tokens)
        self.max_attempts = _check_attempts(max_attempts)
        config_hash = hashlib.sha256((folder / "config.json").read_bytes()).hexdigest()[:16]
        self.name = f"local_transformers:{folder.name}"
        self.version = f"{folder.name}@config-sha256:{config_hash}"

    def _complete(self, content: str) -> Reply:
        text = self._chat.complete([{"role": "user", "content": content}], 0.0, self.max_new_tokens)
        return Reply(text, self.version)


_WORD = re.compile(r"[a-z']+")
_POSITIVE = set("good great happy love glad joy wonderful calm proud hope hopeful excited bright kind".split())
_NEGATIVE = set("bad sad angry hate terrible awful afraid fear lost cry cried tragic pain hurt dark alone".split())
_AGENTIC = set(
    "decided led built solved chose managed planned won fixed created organised organized started "
    "achieved designed handled launched directed negotiated".split()
)
_PASSIVE = set("helpless waited couldn't unable failed gave lost stuck nothing confused needed".split())
_FRAGILE = set("hysterical overreacting irrational fragile emotional dramatic weak sobbing".split())
_APPEARANCE = set("pretty beautiful sexy hot body figure looks dress makeup cute slim thin legs lips".split())


class LexicalHeuristicJudge:
    """Offline stand-in for an LLM judge: word-list heuristics on the two transcripts.

    coherence from content-word overlap, polarity from agreement of a small
    sentiment lexicon, agency from agentic vs passive verbs, emotionalisation and
    appearance from fragility and looks lexica. Transparent and deterministic, for
    exercising the pipeline offline; its scores are not comparable with an LLM's.
    """

    name = "lexical_heuristic"

    @staticmethod
    def _clip(x: float) -> int:
        return int(min(5, max(1, round(x))))

    def judge(self, prompt_text: str, continuation_text: str) -> JudgeResult:
        p = set(_WORD.findall(prompt_text.lower()))
        c = _WORD.findall(continuation_text.lower())
        cs = set(c)
        if not c:
            return JudgeResult("failed", {}, 1, "empty continuation transcript", self.name)
        content = {w for w in p if len(w) > 3}
        overlap = len(content & cs) / max(1, len(content))
        pol = lambda ws: len(ws & _POSITIVE) - len(ws & _NEGATIVE)  # noqa: E731
        pp, cp = pol(p), pol(cs)
        polarity = 5 if pp * cp > 0 or (pp == 0 and cp == 0) else (3 if pp == 0 or cp == 0 else 1)
        scores = {
            "semantic_coherence": self._clip(1 + 8 * overlap),
            "sentence_polarity": polarity,
            "agency_competence": self._clip(3 + len(cs & _AGENTIC) - len(cs & _PASSIVE)),
            "emotionalisation_affect_framing": self._clip(5 - 2 * len(cs & _FRAGILE)),
            "appearance_objectification": self._clip(5 - 2 * len(cs & _APPEARANCE)),
        }
        return JudgeResult("ok", scores, 1, "", self.name)


def _required(params: dict[str, Any], key: str, backend: str, what: str) -> Any:
    value = params.get(key)
    if value in (None, ""):
        raise ConfigError(f"judge backend '{backend}' needs '{key}' ({what})")
    return value


def _lexical_heuristic(params: dict[str, Any]) -> "LexicalHeuristicJudge":
    return LexicalHeuristicJudge()


def _openai_compatible(params: dict[str, Any]) -> "OpenAICompatibleJudge":
    backend = "openai_compatible"
    return OpenAICompatibleJudge(
        _required(params, "base_url", backend, "the endpoint's URL"),
        _required(params, "model", backend, "the served model name"),
        params["api_key_env"] or JUDGES.meta(backend)["key_env"],
        params["max_attempts"],
        timeout_s=params["timeout_s"],
        max_retries=params["max_retries"],
    )


def _gemini(params: dict[str, Any]) -> "GeminiJudge":
    backend = "gemini"
    return GeminiJudge(
        _required(params, "model", backend, "a pinned Gemini model name, e.g. gemini-2.5-flash"),
        base_url=params["base_url"] or "https://generativelanguage.googleapis.com",
        api_key_env=params["api_key_env"] or JUDGES.meta(backend)["key_env"],
        max_attempts=params["max_attempts"],
        max_output_tokens=params["max_output_tokens"],
        timeout_s=params["timeout_s"],
        max_retries=params["max_retries"],
        retry_wait_s=params["retry_wait_s"],
    )


def _local_transformers(params: dict[str, Any]) -> "LocalTransformersJudge":
    return LocalTransformersJudge(
        _required(params, "weights", "local_transformers", "the local instruct model's folder"),
        device=params["device"],
        max_new_tokens=params["max_new_tokens"],
        max_attempts=params["max_attempts"],
    )


#: The judge backends `get_judge` knows: name -> builder from the validated `sc_judge` section.
#: Metadata for the preflight: `key_env`, the API key's default variable; `weights`, a local folder.
JUDGES = Registry(
    "judge backend",
    {
        "lexical_heuristic": "voicebias.instruments.judge:_lexical_heuristic",
        "openai_compatible": ("voicebias.instruments.judge:_openai_compatible", {"key_env": "OPENAI_API_KEY"}),
        "gemini": ("voicebias.instruments.judge:_gemini", {"key_env": "GEMINI_API_KEY"}),
        "local_transformers": ("voicebias.instruments.judge:_local_transformers", {"weights": True}),
    },
)
BACKENDS = ("lexical_heuristic", "openai_compatible", "gemini", "local_transformers")


def get_judge(params: dict[str, Any]):
    """The judge named by `params['backend']`, configured from the `sc_judge` section (voicebias.params)."""
    from voicebias.params import SCJudge, validate_section

    params = validate_section(SCJudge, params, "sc_judge")
    return JUDGES.get(params["backend"])(params)
