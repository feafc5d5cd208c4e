"""Systems that run from the user's checkout of their own repository, in its own environment.

Kimi-Audio, GLM-4-Voice, Step-Audio-2, SpiritLM, SpeechGPT and VAE-GSLM are never imported here:
each runs in a subprocess with the interpreter of its own environment (`python` in the system's
params), the checkout as working directory and on PYTHONPATH. Three routes: **worker** (a driver
from voicebias.systems.drivers loads the model once and answers one JSON line per request),
**command** (one process per request from a command template, run without a shell) and **served**
(the same driver behind voicebias.serving.shim, reached over HTTP through an EndpointPool). The
served route hands the driver what the worker route does, so both share one cache key; before the
first key every endpoint is asked what it runs, and one that breaks that premise is a SetupError.

The routes, failures and endpoint checks: docs/repository-systems.md, "Three routes".
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from voicebias.audio import read_audio, sha256_file, write_audio
from voicebias.clients.endpoints import (
    AllEndpointsDown,
    Breaker,
    EndpointPool,
    Unreachable,
    resolve_endpoints,
    safe_url,
)
from voicebias.clients.retry import RETRYABLE_STATUS, retry_after_s
from voicebias.errors import SetupError, TransientError
from voicebias.io import resolve_path
from voicebias.secrets import child_env
from voicebias.systems.base import (
    ContinuationRequest,
    ContinuationSystem,
    S2SRequest,
    S2SResponse,
    S2SSystem,
    SystemUnderTest,
)

DRIVERS = Path(__file__).resolve().parent / "drivers"
INPUT_RATE = 16000
#: what the shim reports as its models' owner (voicebias/serving/shim.py)
SHIM_OWNER = "voicebias-shim"
#: seconds a served request may take beyond the driver's own limit (the shim answers 504 at that limit)
HTTP_MARGIN_S = 60.0


#: the placeholders a command template may use (the request's fields and the system's paths)
COMMAND_FIELDS = (
    "audio",
    "out",
    "text_out",
    "prompt",
    "seed",
    "lang",
    "target_lang",
    "task",
    "continuation_s",
    "text_stream",
    "weights",
    "checkout",
)
#: characters a POSIX shell gives a meaning outside quotes (separators, pipes, redirection,
#: subshells, expansions, globs); a command runs without a shell, so they are refused
_SHELL_CHARS = set("|&;<>()$`*?[\n")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def _shell_syntax(text: str) -> str | None:
    """The first piece of shell syntax in `text` outside single quotes (inside double
    quotes: `$` and backquotes, which a shell expands there too), or None."""
    quote, word_start, i = None, True, 0
    while i < len(text):
        ch = text[i]
        if quote == "'":
            quote = None if ch == "'" else quote
        elif quote == '"':
            if ch == "\\":
                i += 1
            elif ch == '"':
                quote = None
            elif ch in "$`":
                return f"{ch!r} inside double quotes"
        elif ch == "\\":
            if text[i + 1 : i + 2] == "\n":
                return "a line continuation"
            i, word_start = i + 1, False
        elif ch in "'\"":
            quote, word_start = ch, False
        elif ch in " \t":
            word_start = True
        elif ch in _SHELL_CHARS or (word_start and ch in "~#"):
            return "a line break" if ch == "\n" else repr(ch)
        else:
            word_start = False
        i += 1
    return None


def command_words(template: Any, name: str) -> list[str]:
    """The words of a `command` template: a list as given (each item a word), a string
    split as a POSIX shell splits words (quotes removed). SetupError for a string that
    cannot be split, that uses shell syntax, or that sets a variable before the command."""
    hint = (
        f"give systems.{name}.command as a list of words instead, each placeholder inside its word, e.g. "
        '[python, run.py, "{audio}", "{out}", "--prompt={prompt}"]; the command runs without a shell, so '
        "a pipe, a redirection or a variable belongs in a script of your own"
    )
    if isinstance(template, (list, tuple)):
        words = [str(w) for w in template]
    elif isinstance(template, str):
        try:
            words = shlex.split(template)
        except ValueError as exc:
            raise SetupError(
                f"system '{name}': its command template cannot be split into words ({exc}); {hint}"
            ) from None
        problem = _shell_syntax(template.strip())
        if problem is None and words and _ASSIGNMENT.match(words[0]):
            problem = f"a variable assignment ({words[0]})"
        if problem is not None:
            raise SetupError(f"system '{name}': its command template uses shell syntax ({problem}); {hint}")
    else:
        raise SetupError(f"system '{name}': command must be a list of words or a string, not {type(template).__name__}")
    if not words:
        raise SetupError(f"system '{name}': its command template is empty; {hint}")
    import string

    for word in words:
        try:
            names = [f for _, f, _, _ in string.Formatter().parse(word) if f is not None]
        except ValueError as exc:
            raise SetupError(
                f"system '{name}': the command word {word!r} is not a valid template ({exc}); "
                "write a literal brace as {{ or }}"
            ) from None
        unknown = sorted({re.split(r"[.\[]", f, maxsplit=1)[0] for f in names} - set(COMMAND_FIELDS))
        if unknown:
            raise SetupError(
                f"system '{name}': unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)} "
                f"in its command; the placeholders are {', '.join('{' + f + '}' for f in COMMAND_FIELDS)}"
            )
    return words


def _tail(lines: deque[str], n: int = 12) -> str:
    return "\n".join(list(lines)[-n:]).strip()


class Worker:
    """A driver process answering one JSON request per line."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str], label: str, startup_timeout_s: float):
        self.argv, self.cwd, self.env, self.label = argv, cwd, env, label
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen | None = None
        self.info: dict[str, Any] = {}
        self._n = 0

    def start(self) -> None:
        self.stderr: deque[str] = deque(maxlen=200)
        self.lines: queue.Queue[str | None] = queue.Queue()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
        except OSError as exc:
            raise SetupError(f"{self.label}: cannot start {self.argv[0]}: {exc}") from None
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True).start()
        msg = self._next(self.startup_timeout_s)
        if msg is None or not msg.get("ready"):
            if msg is None:  # stdout closed: the process is exiting
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            why = "exited" if self.proc.poll() is not None else f"did not get ready within {self.startup_timeout_s:g} s"
            self.kill()
            raise SetupError(f"{self.label}: the model worker {why} while loading.\n{_tail(self.stderr)}")
        self.info = msg.get("info") or {}

    @staticmethod
    def _pump(stream, q: queue.Queue) -> None:
        for line in stream:
            q.put(line)
        q.put(None)

    def _drain(self, stream) -> None:
        for line in stream:
            self.stderr.append(line.rstrip())

    def _next(self, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                raise TimeoutError from None
            if line is None:
                return None
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                self.stderr.append(f"[stdout] {line.rstrip()}")

    def request(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            try:
                self.start()
            except TimeoutError:
                self.kill()
                raise SetupError(
                    f"{self.label}: the model worker did not get ready within "
                    f"{self.startup_timeout_s:g} s.\n{_tail(self.stderr)}"
                ) from None
        self._n += 1
        payload = {"id": self._n, **payload}
        try:
            self.proc.stdin.write(json.dumps(payload) + "\n")
            self.proc.stdin.flush()
            while True:
                msg = self._next(timeout_s)
                if msg is None:
                    code = self.proc.wait(timeout=10)
                    raise TransientError(
                        f"the model worker died (exit code {code}); it is restarted for the "
                        f"next attempt. Last output:\n{_tail(self.stderr, 6)}"
                    )
                if msg.get("id") == self._n:
                    return msg
        except BrokenPipeError:
            self.kill()
            raise TransientError(
                f"the model worker is gone; restarting. Last output:\n{_tail(self.stderr, 6)}"
            ) from None
        except TimeoutError:
            self.kill()
            raise TransientError(f"no answer within {timeout_s:g} s; the worker was stopped and is restarted") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()


class RepositoryBackend:
    """Setup checks, input/output files and the subprocess (or the shims serving it) for one repository-based system.

    `local` runs the driver here even when endpoints are named (what ``voicebias serve`` does
    to start the servers themselves).
    """

    def __init__(self, system: Any, repo: str, driver: str | None, root: Path | None, local: bool = False):
        self.system = system
        self.name = system.name
        self.repo = repo
        params, card = system.params, system.card
        req = card.get("requires") or {}
        self.root = Path(root) if root else None
        self.timeout_s = float(params.get("timeout_s") or 600.0)
        self.command = params.get("command")
        self.command_words = command_words(self.command, self.name) if self.command is not None else None
        self.shipped = DRIVERS / driver if driver else None
        self.driver_path = resolve_path(params["driver"], self.root) if params.get("driver") else self.shipped
        self.driver = self.driver_path.name if self.driver_path else None
        self._lock = threading.Lock()
        self.worker: Worker | None = None
        self.served: ShimClient | None = None
        endpoints, source = resolve_endpoints(self.name, params, card, self.root, system.max_concurrency)
        if source != "default" and not local:
            if self.command is not None:
                raise SetupError(
                    f"system '{self.name}' runs a 'command' per request, which a shim does not serve; "
                    f"drop 'command' or its endpoints (from {source})"
                )
            self.served = ShimClient(self, endpoints, source)
            self.workdir = Path(tempfile.mkdtemp(prefix=f"voicebias-{self.name}-"))
            return
        checkout = params.get("checkout") or req.get("checkout")
        weights = params.get("weights") or req.get("weights")
        if not checkout:
            raise ValueError(f"system '{self.name}': no checkout path (params 'checkout' or card requires.checkout)")
        self.checkout = resolve_path(checkout, self.root)
        self.weights = resolve_path(weights, self.root) if weights else None
        if not self.checkout.is_dir():
            raise SetupError(
                f"system '{self.name}' runs from a checkout of {repo}, expected at {checkout}, which is missing. "
                f"Clone it there (git clone https://github.com/{repo} {checkout}), create its own environment as its "
                f"README says, and set systems.{self.name}.python to that environment's interpreter; or serve it "
                f"on the machine that has them (voicebias serve {self.name}) and name that server's endpoints."
            )
        if self.weights is not None and not self.weights.exists():
            raise SetupError(
                f"system '{self.name}': model weights expected at {weights} are missing; download "
                f"{card.get('checkpoint', 'the checkpoint')} there (see models/cards/{self.name}.yaml)"
            )
        python = params.get("python")
        if python:
            self.python = str(resolve_path(python, self.root))
        else:
            guess = self.checkout / ".venv" / "bin" / "python"
            if not guess.exists():
                raise SetupError(
                    f"system '{self.name}': set systems.{self.name}.python in params.yaml to the "
                    f"interpreter of {repo}'s own environment (none found at {guess})"
                )
            self.python = str(guess)
        if not Path(self.python).exists() and shutil.which(self.python) is None:
            raise SetupError(f"system '{self.name}': the interpreter {python} does not exist")
        if self.command is None and self.driver_path is None:
            raise SetupError(
                f"system '{self.name}': {repo} has no importable inference API; set "
                f"systems.{self.name}.command to the command that runs its inference script on one "
                "prompt (placeholders {audio}, {out}, {text_out}, {seed}, {continuation_s}, {weights})"
            )
        if self.command is None and not self.driver_path.is_file():
            raise SetupError(f"system '{self.name}': driver {self.driver_path} not found")
        self.workdir = Path(tempfile.mkdtemp(prefix=f"voicebias-{self.name}-"))

    # -- what changes the answer ---------------------------------------------
    def settings(self) -> dict[str, Any]:
        """The settings handed to the driver: the params without the runner's knobs."""
        return SystemUnderTest.generation_settings(self.system)

    def key_settings(self) -> dict[str, Any]:
        """What the cache key adds to the settings: the sha256 of the driver that answers, when it is not
        the shipped one (the shims' driver when served, else params `driver`). Asks the shims on first use."""
        if self.served is not None:
            sha = self.served.info()["driver_sha256"]
        elif self.command is None and self.driver_path != self.shipped:
            sha = sha256_file(self.driver_path)
        else:
            return {}
        shipped = sha256_file(self.shipped) if self.shipped is not None and self.shipped.is_file() else None
        return {} if sha == shipped else {"driver_sha256": sha}

    def env(self) -> dict[str, str]:
        """The allow-listed environment (voicebias.secrets.child_env) with the checkout on PYTHONPATH:
        no key of this process reaches the repository's code."""
        return child_env(
            {
                "PYTHONPATH": os.pathsep.join([str(self.checkout), *filter(None, [os.environ.get("PYTHONPATH")])]),
                "PYTHONUNBUFFERED": "1",
            }
        )

    def driver_config(self) -> dict[str, Any]:
        settings = self.settings()
        return {
            "weights": str(self.weights) if self.weights else None,
            "checkout": str(self.checkout),
            "checkpoint": str(self.system.card.get("checkpoint", "")),
            "device": self.system.params["device"],
            "settings": settings,
        }

    def _worker(self) -> Worker:
        if self.worker is None:
            argv = [self.python, str(self.driver_path), json.dumps(self.driver_config())]
            self.worker = Worker(
                argv,
                self.checkout,
                self.env(),
                f"system '{self.name}' ({self.repo})",
                float(self.system.params["startup_timeout_s"]),
            )
        return self.worker

    def run(self, request: S2SRequest | ContinuationRequest, extra: dict[str, Any]) -> S2SResponse:
        if self.served is not None:  # the shims bound their own concurrency
            return self._run(request, extra)
        with self._lock:  # one model process: one request at a time
            return self._run(request, extra)

    def _run(self, request: S2SRequest | ContinuationRequest, extra: dict[str, Any]) -> S2SResponse:
        x, sr = read_audio(request.audio_path, target_sr=INPUT_RATE)
        tag = f"{request.stimulus_id}-{time.monotonic_ns()}-{threading.get_ident()}"
        wav_in = self.workdir / f"{tag}-in.wav"
        out = self.workdir / f"{tag}-out.wav"
        text_out = self.workdir / f"{tag}-out.txt"
        import soundfile as sf

        sf.write(str(wav_in), x, sr, subtype="PCM_16", format="WAV")
        payload = {
            "audio": str(wav_in),
            "out": str(out),
            "prompt": request.prompt,
            "seed": int(request.seed),
            "lang": request.lang,
            "target_lang": request.target_lang,
            **extra,
        }
        try:
            if self.served is not None:
                return self.served.run(payload, wav_in, out)
            if self.command is not None:
                reply = self._run_command(payload, text_out)
            else:
                reply = self._worker().request(payload, self.timeout_s)
            return self._response(reply, out)
        finally:
            for p in (wav_in, out, text_out):
                p.unlink(missing_ok=True)

    def _run_command(self, payload: dict[str, Any], text_out: Path) -> dict[str, Any]:
        fields = {
            **dict.fromkeys(COMMAND_FIELDS, ""),
            **payload,
            "text_out": str(text_out),
            "weights": str(self.weights or ""),
            "checkout": str(self.checkout),
        }
        try:  # each word on its own: a value is never split into words or read by a shell
            argv = [w.format(**fields) for w in self.command_words]
        except (KeyError, IndexError, AttributeError, ValueError) as exc:
            raise SetupError(
                f"system '{self.name}': its command could not be filled in ({type(exc).__name__}: {exc})"
            ) from None
        if argv[0] == "python":
            argv[0] = self.python
        try:
            res = subprocess.run(
                argv,
                cwd=self.checkout,
                env=self.env(),
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout_s,
            )
        except subprocess.TimeoutExpired:
            raise TransientError(f"the inference command took longer than {self.timeout_s:g} s") from None
        except (FileNotFoundError, PermissionError) as exc:  # every request would fail the same way
            raise SetupError(
                f"system '{self.name}': its command cannot be started: {argv[0]} ({exc.strerror})"
            ) from None
        if res.returncode != 0:
            tail = "\n".join(res.stderr.strip().splitlines()[-6:])
            return {"status": "failed", "error": f"the inference command failed (exit code {res.returncode}): {tail}"}
        text = text_out.read_text(encoding="utf-8").strip() if text_out.exists() else None
        return {"status": "ok", "text": text}

    def _response(self, reply: dict[str, Any], out: Path, prov: dict[str, Any] | None = None) -> S2SResponse:
        """The response from the driver's reply and output file; `prov` is the provenance (default: the
        repository and what the worker reported)."""
        if prov is None:
            info = self.worker.info if self.worker is not None else {}
            prov = provenance(self.repo, info)
        if reply.get("status") != "ok":
            return S2SResponse.failed(str(reply.get("error") or "the driver reported a failure"), **prov)
        if not out.exists():
            return S2SResponse.failed("the model produced no audio file", **prov)
        audio, sr = read_audio(out)
        text = reply.get("text")
        return S2SResponse(status="ok", transcript=text if text else None, audio=audio, sample_rate=sr, provenance=prov)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def provenance(repo: str, info: dict[str, Any]) -> dict[str, Any]:
    """A response's provenance: the repository, what the driver reported when it got ready, and its
    revision as the model revision. No path of the machine that ran it (the checkout, the interpreter):
    the same answer from another machine or a served copy is recorded byte for byte the same."""
    prov = {"repository": repo, **info}
    if info.get("revision"):
        prov["model_revision"] = info["revision"]
    return prov


class ShimClient:
    """The served route of one repository system: its shims' endpoints, what they run, and one call."""

    def __init__(self, backend: RepositoryBackend, endpoints: list[Any], source: str):
        self.backend = backend
        self.name = backend.name
        self.endpoints, self.source = endpoints, source
        self.urls = [str(e.url).rstrip("/") for e in endpoints]
        self.pool = EndpointPool(endpoints, name=self.name, breaker=Breaker.from_params(backend.system.params))
        self.model = str(backend.system.card.get("checkpoint") or self.name)
        self._info: dict[str, Any] | None = None
        self._served: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def endpoint(self, i: int) -> str:
        return safe_url(self.urls[i])

    # -- what the shims run --------------------------------------------------
    def _get(self, i: int, path: str) -> tuple[int, Any]:
        import requests

        base = self.urls[i]
        url = f"{base.removesuffix('/v1')}{path}" if path == "/health" else f"{base}{path}"  # /health is at the root
        try:
            r = requests.get(url, headers=self.endpoints[i].headers(), timeout=30.0)
        except requests.RequestException as exc:
            raise SetupError(
                f"system '{self.name}': endpoint {self.endpoint(i)}: no shim answers at {safe_url(url)} "
                f"({type(exc).__name__}); start it with `voicebias serve {self.name}` on the machine "
                f"that has the checkout and weights, or name the servers that run (these came from "
                f"{self.source})"
            ) from None
        try:
            body = r.json()
        except ValueError:
            body = None
        return r.status_code, body

    def info(self) -> dict[str, Any]:
        """What every endpoint runs, asked once (see the module docstring); a broken premise is a SetupError."""
        with self._lock:
            if self._info is None:
                served = [self._ask(i) for i in range(len(self.urls))]
                first = served[0]
                for i, s in enumerate(served[1:], start=1):
                    for what, key in (("driver (sha256)", "driver_sha256"), ("model revision", "revision")):
                        if s[key] != first[key]:
                            raise SetupError(
                                f"system '{self.name}': endpoint {self.endpoint(i)} runs {what} "
                                f"{s[key]!r}, {self.endpoint(0)} runs {first[key]!r}; every endpoint "
                                "of a system must run the same driver and model"
                            )
                self._served = served
                self._info = {"driver_sha256": first["driver_sha256"], "revision": first["revision"]}
            return self._info

    def _ask(self, i: int) -> dict[str, Any]:
        at = f"system '{self.name}': endpoint {self.endpoint(i)}"
        status, body = self._get(i, "/health")
        if status != 200:
            raise SetupError(
                f"{at} is not ready (GET /health answered HTTP {status}: its driver is loading or "
                f"failed; see the server's log)"
            )
        status, body = self._get(i, "/models")
        if status == 401:
            raise SetupError(
                f"{at} wants a bearer token (GET /v1/models answered HTTP 401); voicebias serve writes each "
                f"shim's token into the endpoints file beside its url (these endpoints came from {self.source})"
            )
        entries = body.get("data") if isinstance(body, dict) else None
        if status != 200 or not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
            raise SetupError(f"{at}: GET /v1/models answered HTTP {status} without a model list")
        entry = entries[0]
        driver = entry.get("driver") if isinstance(entry.get("driver"), dict) else {}
        config = entry.get("config") if isinstance(entry.get("config"), dict) else {}
        if entry.get("owned_by") != SHIM_OWNER or not driver.get("sha256"):
            raise SetupError(
                f"{at} is not a voicebias shim of this version (it serves {entry.get('id')!r}, owned by "
                f"{entry.get('owned_by')!r}, and reports no driver); serve a repository system with "
                f"`voicebias serve {self.name}`"
            )
        if entry.get("id") != self.model or config.get("checkpoint") != self.model:
            raise SetupError(f"{at} serves {entry.get('id')!r}, not {self.model} (the card's checkpoint)")
        mine = self.backend.settings()
        theirs = config.get("settings")
        if theirs != mine:
            raise SetupError(
                f"{at} runs its driver with settings {json.dumps(theirs, sort_keys=True)}; this "
                f"system's params give {json.dumps(mine, sort_keys=True)}. The answers would differ from "
                f"what the cache key says: restart it with these params (voicebias serve --stop "
                f"{self.name}; voicebias serve {self.name})"
            )
        info = entry.get("info") if isinstance(entry.get("info"), dict) else {}
        return {
            "driver_sha256": str(driver["sha256"]),
            "revision": info.get("revision"),
            "info": info,
        }

    # -- one call ------------------------------------------------------------
    def body(self, payload: dict[str, Any], wav: bytes) -> dict[str, Any]:
        """The chat-completions request the shim takes, holding what the worker route hands the driver."""
        import base64

        audio = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode("ascii"), "format": "wav"}}
        messages: list[dict[str, Any]] = [{"role": "user", "content": [audio]}]
        if payload["prompt"]:
            messages.insert(0, {"role": "system", "content": payload["prompt"]})
        passed = {k: v for k, v in payload.items() if k not in ("audio", "out", "prompt")}
        return {"model": self.model, "messages": messages, "modalities": ["text", "audio"], **passed}

    def run(self, payload: dict[str, Any], wav_in: Path, out: Path) -> S2SResponse:
        self.info()
        body = self.body(payload, wav_in.read_bytes())
        try:
            i, (status, reply) = self.pool.call(lambda i: self._post(i, body))
        except AllEndpointsDown as exc:
            raise TransientError(str(exc), retry_after_s=exc.retry_after_s) from exc
        served = self._served[i]
        prov = provenance(self.backend.repo, served["info"])
        prov["endpoint"] = self.endpoint(i)
        if status == 422:  # the driver's error for this input, as the worker route records it
            return self.backend._response({"status": "failed", "error": _message(reply)}, out, prov)
        message = ((reply.get("choices") or [{}])[0].get("message") or {}) if isinstance(reply, dict) else {}
        audio = message.get("audio") if isinstance(message.get("audio"), dict) else {}
        if not audio.get("data"):
            return S2SResponse.failed(
                "the shim's reply has no audio"
                + (f" (it wrote: {str(message.get('content'))[:200]})" if message.get("content") else ""),
                **prov,
            )
        import base64
        import binascii

        try:
            out.write_bytes(base64.b64decode(str(audio["data"]), validate=True))
        except (binascii.Error, ValueError) as exc:
            return S2SResponse.failed(f"the shim's reply audio is not base64: {exc}", **prov)
        return self.backend._response({"status": "ok", "text": audio.get("transcript")}, out, prov)

    def _post(self, i: int, body: dict[str, Any]) -> tuple[int, Any]:
        """One try at endpoint `i`: (status, reply) for 200 and 422; a timeout or a failed connection raises
        Unreachable (try another); 429 and 5xx are transient; other answers fail the item."""
        import requests

        timeout = self.backend.timeout_s + HTTP_MARGIN_S
        try:
            r = requests.post(
                f"{self.urls[i]}/chat/completions",
                json=body,
                headers=self.endpoints[i].headers(),
                timeout=(10.0, timeout),
            )
        except requests.Timeout as exc:
            raise Unreachable(f"timeout after {timeout:g} s") from exc
        except requests.RequestException as exc:
            raise Unreachable(f"connection error: {exc}") from exc
        try:
            reply = r.json()
        except ValueError:
            reply = None
        if r.status_code in (200, 422):
            if not isinstance(reply, dict):
                raise RuntimeError(f"the shim's reply is not a JSON object: {r.text[:200]!r}")
            return r.status_code, reply
        msg = f"HTTP {r.status_code}: {_message(reply) or r.text[:300]}"
        if r.status_code in RETRYABLE_STATUS or r.status_code >= 500:
            raise TransientError(msg, retry_after_s=retry_after_s(r.headers))
        raise RuntimeError(msg)


def _message(reply: Any) -> str:
    err = reply.get("error") if isinstance(reply, dict) else None
    return str(err.get("message") or "") if isinstance(err, dict) else ""


class _Repository:
    """What both kinds of repository system share: the backend, the cache key's driver part, the run facts."""

    repo: str = ""
    driver: str | None = None

    def _setup(self, root: Path | None, local: bool) -> None:
        self.backend = RepositoryBackend(self, self.repo, self.driver, root, local=local)
        if self.backend.served is not None:
            self.max_concurrency = self.backend.served.pool.capacity  # the runner's thread count

    def generation_settings(self) -> dict[str, Any]:
        return super().generation_settings() | self.backend.key_settings()

    def check(self) -> None:
        """The served route: every shim answers and runs what the params say (asked once, see the module
        docstring). The worker and command routes run here and check their checkout when built."""
        if self.backend.served is not None:
            self.backend.served.info()

    @property
    def probed(self) -> bool:
        """Served over HTTP (the shims): the determinism probe re-sends some requests."""
        return self.backend.served is not None

    def run_facts(self) -> dict[str, Any]:
        served = self.backend.served
        return {"endpoints": served.pool.stats()} if served is not None and len(served.endpoints) > 1 else {}

    def close(self) -> None:
        self.backend.close()


class RepositoryS2SSystem(_Repository, S2SSystem):
    """A speech-to-speech system run from its own repository (see the module docstring)."""

    def __init__(
        self, name: str, card: dict[str, Any], params: dict[str, Any], root: Path | None = None, local: bool = False
    ):
        S2SSystem.__init__(self, name, card, params)
        self._setup(root, local)

    def respond(self, request: S2SRequest) -> S2SResponse:
        return self.backend.run(request, {"task": request.task})


class RepositoryContinuationSystem(_Repository, ContinuationSystem):
    """A speech-continuation system run from its own repository (see the module docstring)."""

    def __init__(
        self, name: str, card: dict[str, Any], params: dict[str, Any], root: Path | None = None, local: bool = False
    ):
        ContinuationSystem.__init__(self, name, card, params)
        self._setup(root, local)
        self.text_stream = bool(params.get("text_stream", card.get("text_stream", type(self).text_stream)))

    def continue_speech(self, request: ContinuationRequest) -> S2SResponse:
        return self.backend.run(
            request, {"task": request.task, "continuation_s": request.continuation_s, "text_stream": self.text_stream}
        )


__all__ = [
    "RepositoryBackend",
    "RepositoryContinuationSystem",
    "RepositoryS2SSystem",
    "ShimClient",
    "Worker",
    "provenance",
    "write_audio",
]
