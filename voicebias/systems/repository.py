"""Systems that run from the user's checkout of their own repository, in its own environment.

Kimi-Audio, GLM-4-Voice, Step-Audio-2, SpiritLM, SpeechGPT and VAE-GSLM ship their
inference code in research repositories with pins that clash with this project
(Step-Audio-2 pins transformers 4.49, VAE-GSLM old torch, ...). They are never
imported here: each runs in a subprocess with the interpreter of its own
environment (`python` in the system's params), with the checkout as working
directory and on PYTHONPATH.

Two routes:

- **worker** (every shipped system): a small driver script shipped in
  :mod:`voicebias.systems.drivers` (``<system>_driver.py``, never named like the
  package it imports, since a script's folder comes first on sys.path) loads the
  model once and then answers one JSON line per request on stdin/stdout (audio in as a 16 kHz WAV path,
  audio out as a file path plus the model's text). Model loading happens at the
  first call that is not a cache hit, so a fully cached re-run never loads it.
- **command** (any system with `command` in its params, which replaces its driver):
  one process per request from a command template, for a wrapper of the user's own
  (docs/repository-systems.md). Placeholders: {audio} (input WAV),
  {out} (output WAV to write), {text_out} (optional text file), {prompt}, {seed},
  {continuation_s}, {weights}, {checkout}.

A missing checkout, environment or weights raises :class:`SetupError` with what to
do; a worker that cannot start raises SetupError with the tail of its stderr (the
stage stops: nothing could run); a worker that dies or hangs mid-run is restarted
and the call retried (TransientError); an error the driver reports for one input is
recorded as that input's failure.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from voicebias.audio import read_audio, write_audio
from voicebias.secrets import child_env
from voicebias.systems.base import (
    ContinuationRequest, ContinuationSystem, S2SRequest, S2SResponse, S2SSystem, SetupError, TransientError,
    resolve_path,
)

DRIVERS = Path(__file__).resolve().parent / "drivers"
INPUT_RATE = 16000


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
            self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
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
                raise SetupError(f"{self.label}: the model worker did not get ready within "
                                 f"{self.startup_timeout_s:g} s.\n{_tail(self.stderr)}") from None
        self._n += 1
        payload = {"id": self._n, **payload}
        try:
            self.proc.stdin.write(json.dumps(payload) + "\n")
            self.proc.stdin.flush()
            while True:
                msg = self._next(timeout_s)
                if msg is None:
                    code = self.proc.wait(timeout=10)
                    raise TransientError(f"the model worker died (exit code {code}); it is restarted for the "
                                         f"next attempt. Last output:\n{_tail(self.stderr, 6)}")
                if msg.get("id") == self._n:
                    return msg
        except BrokenPipeError:
            self.kill()
            raise TransientError(f"the model worker is gone; restarting. Last output:\n{_tail(self.stderr, 6)}") from None
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
    """Setup checks, input/output files and the subprocess for one repository-based system."""

    def __init__(self, system: Any, repo: str, driver: str | None, root: Path | None):
        self.system = system
        self.name = system.name
        self.repo = repo
        params, card = system.params, system.card
        req = card.get("requires") or {}
        self.root = Path(root) if root else None
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
                f"README says, and set systems.{self.name}.python to that environment's interpreter.")
        if self.weights is not None and not self.weights.exists():
            raise SetupError(f"system '{self.name}': model weights expected at {weights} are missing; download "
                             f"{card.get('checkpoint', 'the checkpoint')} there (see models/cards/{self.name}.yaml)")
        python = params.get("python")
        if python:
            self.python = str(resolve_path(python, self.root))
        else:
            guess = self.checkout / ".venv" / "bin" / "python"
            if not guess.exists():
                raise SetupError(f"system '{self.name}': set systems.{self.name}.python in params.yaml to the "
                                 f"interpreter of {repo}'s own environment (none found at {guess})")
            self.python = str(guess)
        if not Path(self.python).exists() and shutil.which(self.python) is None:
            raise SetupError(f"system '{self.name}': the interpreter {python} does not exist")
        self.timeout_s = float(params.get("timeout_s") or 600.0)
        self.command = params.get("command")
        self.driver = driver
        if self.command is None and driver is None:
            raise SetupError(f"system '{self.name}': {repo} has no importable inference API; set "
                             f"systems.{self.name}.command to the command that runs its inference script on one "
                             "prompt (placeholders {audio}, {out}, {text_out}, {seed}, {continuation_s}, {weights})")
        self.workdir = Path(tempfile.mkdtemp(prefix=f"voicebias-{self.name}-"))
        self._lock = threading.Lock()
        self.worker: Worker | None = None

    def env(self) -> dict[str, str]:
        """The allow-listed environment (voicebias.secrets.child_env) with the checkout on PYTHONPATH:
        no key of this process reaches the repository's code."""
        return child_env({"PYTHONPATH": os.pathsep.join([str(self.checkout),
                                                         *filter(None, [os.environ.get("PYTHONPATH")])]),
                          "PYTHONUNBUFFERED": "1"})

    def driver_config(self) -> dict[str, Any]:
        settings = self.system.generation_settings()
        return {"weights": str(self.weights) if self.weights else None, "checkout": str(self.checkout),
                "checkpoint": str(self.system.card.get("checkpoint", "")),
                "device": self.system.params["device"], "settings": settings}

    def _worker(self) -> Worker:
        if self.worker is None:
            argv = [self.python, str(DRIVERS / self.driver), json.dumps(self.driver_config())]
            self.worker = Worker(argv, self.checkout, self.env(), f"system '{self.name}' ({self.repo})",
                                 float(self.system.params["startup_timeout_s"]))
        return self.worker

    def run(self, request: S2SRequest | ContinuationRequest, extra: dict[str, Any]) -> S2SResponse:
        with self._lock:  # one model process: one request at a time
            x, sr = read_audio(request.audio_path, target_sr=INPUT_RATE)
            tag = f"{request.stimulus_id}-{time.monotonic_ns()}"
            wav_in = self.workdir / f"{tag}-in.wav"
            out = self.workdir / f"{tag}-out.wav"
            text_out = self.workdir / f"{tag}-out.txt"
            import soundfile as sf

            sf.write(str(wav_in), x, sr, subtype="PCM_16", format="WAV")
            payload = {"audio": str(wav_in), "out": str(out), "prompt": request.prompt, "seed": int(request.seed),
                       "lang": request.lang, "target_lang": request.target_lang, **extra}
            try:
                if self.command is not None:
                    reply = self._run_command(payload, text_out)
                else:
                    reply = self._worker().request(payload, self.timeout_s)
                return self._response(reply, out)
            finally:
                for p in (wav_in, out, text_out):
                    p.unlink(missing_ok=True)

    def _run_command(self, payload: dict[str, Any], text_out: Path) -> dict[str, Any]:
        fields = {**payload, "text_out": str(text_out), "weights": str(self.weights or ""),
                  "checkout": str(self.checkout), "continuation_s": payload.get("continuation_s", "")}
        cmd = self.command if isinstance(self.command, list) else [str(self.command)]
        try:
            argv = [str(a).format(**fields) for a in cmd]
        except KeyError as exc:
            raise SetupError(f"system '{self.name}': unknown placeholder {exc} in its command") from None
        if not isinstance(self.command, list):
            argv = ["/bin/sh", "-c", argv[0]]
        elif argv and argv[0] == "python":
            argv[0] = self.python
        try:
            res = subprocess.run(argv, cwd=self.checkout, env=self.env(), capture_output=True, text=True,
                                 timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise TransientError(f"the inference command took longer than {self.timeout_s:g} s") from None
        if res.returncode != 0:
            tail = "\n".join(res.stderr.strip().splitlines()[-6:])
            return {"status": "failed", "error": f"the inference command failed (exit code {res.returncode}): {tail}"}
        text = text_out.read_text(encoding="utf-8").strip() if text_out.exists() else None
        return {"status": "ok", "text": text}

    def _response(self, reply: dict[str, Any], out: Path) -> S2SResponse:
        prov = {"repository": self.repo, "checkout": str(self.checkout), "python": self.python}
        if self.worker is not None:
            prov.update(self.worker.info)
            if self.worker.info.get("revision"):
                prov["model_revision"] = self.worker.info["revision"]
        if reply.get("status") != "ok":
            return S2SResponse.failed(str(reply.get("error") or "the driver reported a failure"), **prov)
        if not out.exists():
            return S2SResponse.failed("the model produced no audio file", **prov)
        audio, sr = read_audio(out)
        text = reply.get("text")
        return S2SResponse(status="ok", transcript=text if text else None, audio=audio, sample_rate=sr,
                           provenance=prov)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


class RepositoryS2SSystem(S2SSystem):
    """A speech-to-speech system run from its own repository (see the module docstring)."""

    repo: str = ""
    driver: str | None = None

    def __init__(self, name: str, card: dict[str, Any], params: dict[str, Any], root: Path | None = None):
        super().__init__(name, card, params)
        self.backend = RepositoryBackend(self, self.repo, self.driver, root)

    def respond(self, request: S2SRequest) -> S2SResponse:
        return self.backend.run(request, {"task": request.task})

    def close(self) -> None:
        self.backend.close()


class RepositoryContinuationSystem(ContinuationSystem):
    """A speech-continuation system run from its own repository (see the module docstring)."""

    repo: str = ""
    driver: str | None = None

    def __init__(self, name: str, card: dict[str, Any], params: dict[str, Any], root: Path | None = None):
        super().__init__(name, card, params)
        self.backend = RepositoryBackend(self, self.repo, self.driver, root)
        self.text_stream = bool(params.get("text_stream", card.get("text_stream", type(self).text_stream)))

    def continue_speech(self, request: ContinuationRequest) -> S2SResponse:
        return self.backend.run(request, {"task": request.task, "continuation_s": request.continuation_s,
                                          "text_stream": self.text_stream})

    def close(self) -> None:
        self.backend.close()


__all__ = ["RepositoryBackend", "RepositoryContinuationSystem", "RepositoryS2SSystem", "Worker", "write_audio"]
