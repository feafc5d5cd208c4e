"""Run one system on one task over every stimulus: cached, resumable, retrying.

Each call is keyed by a hash of (system card, generation settings, task, prompt,
stimulus audio sha256, target language, seed). A finished call is stored in the
cache before it is reported, so an interrupted stage resumes where it stopped and
no finished call is ever repeated. Transient failures are retried with exponential
backoff; a call that still fails is recorded as failed with its reason, never
replaced by an invented output.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from voicebias.audio import sha256_file, write_audio
from voicebias.systems.base import S2SRequest, S2SResponse, S2SSystem, TransientError
from voicebias.tasks import Task
from voicebias.validation import ValidationReport, expectations, require_valid, where

RESPONSE_COLUMNS = [
    "system", "task", "stimulus_id", "passage_id", "lang", "target_lang", "pole", "voice_gender", "voice_id",
    "prompt", "transcript", "status", "error", "output_audio", "output_sha256", "output_duration_s",
    "model_revision", "latency_s", "attempts", "started_at", "finished_at", "cache_key",
]


@dataclass
class RetryPolicy:
    max_attempts: int = 4
    base_delay_s: float = 1.0
    max_delay_s: float = 30.0


def cache_key(system: S2SSystem, request: S2SRequest) -> str:
    payload = {
        "card": system.card, "settings": system.generation_settings(), "task": request.task,
        "prompt": request.prompt, "audio_sha256": request.audio_sha256, "target_lang": request.target_lang,
        "seed": request.seed,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def call_with_retries(system: S2SSystem, request: S2SRequest, policy: RetryPolicy, sleep=time.sleep) -> tuple[S2SResponse, int]:
    """(response, attempts). Transient errors retry with backoff; others fail at once."""
    delay = policy.base_delay_s
    for attempt in range(1, policy.max_attempts + 1):
        try:
            return system.respond(request), attempt
        except TransientError as exc:
            if attempt == policy.max_attempts:
                return S2SResponse.failed(f"transient error after {attempt} attempts: {exc}"), attempt
            sleep(min(delay, policy.max_delay_s))
            delay *= 2
        except Exception as exc:  # one bad item must not kill the run
            return S2SResponse.failed(f"{type(exc).__name__}: {exc}"), attempt
    raise AssertionError("unreachable")


class ResponseCache:
    """Content-addressed store of finished calls: <dir>/<key[:2]>/<key>/{response.json,audio.flac}."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def _dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get(self, key: str) -> dict[str, Any] | None:
        meta = self._dir(key) / "response.json"
        if not meta.exists():
            return None
        with open(meta, encoding="utf-8") as fh:
            record = json.load(fh)
        if record.get("output_audio_cached") and not (self._dir(key) / "audio.flac").exists():
            return None
        return record

    def put(self, key: str, record: dict[str, Any], response: S2SResponse) -> None:
        d = self._dir(key)
        tmp = d.with_name(d.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        if response.audio is not None:
            write_audio(tmp / "audio.flac", response.audio, int(response.sample_rate))
            record["output_audio_cached"] = True
        with open(tmp / "response.json", "w", encoding="utf-8") as fh:
            json.dump(record, fh, ensure_ascii=False, indent=1, default=str)
        if d.exists():
            shutil.rmtree(d)
        tmp.rename(d)  # atomic: a killed run never leaves a half-written entry

    def audio_path(self, key: str) -> Path:
        return self._dir(key) / "audio.flac"


def run_task(
    system: S2SSystem, task: Task, stimuli: pd.DataFrame, out_dir: Path, cache: ResponseCache, seed: int,
    root: Path, policy: RetryPolicy | None = None,
) -> tuple[pd.DataFrame, dict[str, int]]:
    """Run `task` on every stimulus whose language the task covers.

    Writes output audio to out_dir/audio/<stimulus_id>.flac and returns the
    responses table plus counts (calls made, cache hits, failures).
    """
    policy = policy or RetryPolicy()
    audio_dir = out_dir / "audio"
    audio_dir.mkdir(parents=True, exist_ok=True)
    todo = stimuli[stimuli["lang"].isin(task.languages())].sort_values("stimulus_id")
    requests = [
        S2SRequest(stimulus_id=s.stimulus_id, lang=s.lang, target_lang=task.target_lang(s.lang), task=task.name,
                   prompt=task.prompt(s.lang), audio_path=str(root / s.path), audio_sha256=s.sha256, seed=seed)
        for s in todo.itertuples()
    ]
    counts = {"requests": len(requests), "calls": 0, "cache_hits": 0, "failed": 0}
    lock = threading.Lock()

    def bump(name: str) -> None:
        with lock:
            counts[name] += 1

    def one(req: S2SRequest) -> dict[str, Any]:
        key = cache_key(system, req)
        record = cache.get(key)
        if record is not None and record["status"] == "ok":
            bump("cache_hits")
        else:
            started = _now()
            t0 = time.perf_counter()
            resp, attempts = call_with_retries(system, req, policy)
            bump("calls")
            record = {
                "status": resp.status, "transcript": resp.transcript, "error": resp.error,
                "model_revision": resp.provenance.get("model_revision", system.card.get("revision", "")),
                "latency_s": round(time.perf_counter() - t0, 4), "attempts": attempts, "started_at": started,
                "finished_at": _now(), "request": asdict(req) | {"audio_path": None}, "provenance": resp.provenance,
            }
            if resp.status == "ok" and resp.audio is None:
                record.update(status="failed", error="system returned no audio")
            if record["status"] == "ok":
                cache.put(key, record, resp)
        row = {
            "system": system.name, "task": req.task, "stimulus_id": req.stimulus_id, "lang": req.lang,
            "target_lang": req.target_lang, "prompt": req.prompt, "cache_key": key,
            **{k: record.get(k) for k in ("transcript", "status", "error", "model_revision", "latency_s",
                                          "attempts", "started_at", "finished_at")},
        }
        if record["status"] == "ok":
            dest = audio_dir / f"{req.stimulus_id}.flac"
            shutil.copyfile(cache.audio_path(key), dest)
            import soundfile as sf

            info = sf.info(str(dest))
            row.update(output_audio=str(dest.relative_to(root)), output_sha256=sha256_file(dest),
                       output_duration_s=round(info.frames / info.samplerate, 4))
        else:
            bump("failed")
            row.update(output_audio=None, output_sha256=None, output_duration_s=None)
        return row

    with ThreadPoolExecutor(max_workers=max(1, system.max_concurrency)) as pool:
        rows = list(tqdm(pool.map(one, requests), total=len(requests), desc=f"{system.name}/{task.name}"))
    table = pd.DataFrame(rows)
    meta = todo.set_index("stimulus_id")[["passage_id", "pole", "voice_gender", "voice_id"]]
    table = table.join(meta, on="stimulus_id")
    for col in RESPONSE_COLUMNS:
        if col not in table:
            table[col] = None
    return table[RESPONSE_COLUMNS], counts


def validate_responses(table: pd.DataFrame) -> ValidationReport:
    """Gate on the responses/transcripts table."""
    E = expectations()
    return require_valid(table, "responses", [
        E.ExpectTableColumnsToMatchSet(column_set=RESPONSE_COLUMNS, exact_match=True),
        E.ExpectColumnValuesToBeUnique(column="stimulus_id"),
        E.ExpectColumnValuesToBeInSet(column="status", value_set=["ok", "failed"]),
        E.ExpectColumnValuesToBeInSet(column="lang", value_set=["en", "es", "zh"]),
        E.ExpectColumnValuesToBeInSet(column="voice_gender", value_set=["male", "female"]),
        E.ExpectColumnValuesToNotBeNull(column="transcript", row_condition=where("status", "ok")),
        E.ExpectColumnValuesToNotBeNull(column="output_audio", row_condition=where("status", "ok")),
        E.ExpectColumnValuesToNotBeNull(column="error", row_condition=where("status", "failed")),
        E.ExpectColumnValuesToNotBeNull(column="prompt"),
    ])


def run_stage(params: dict[str, Any], system_name: str, task_name: str, manifest_path: Path, passages_path: Path,
              gate_metrics: Path, out_dir: Path, stats_path: Path, cache_dir: Path, root: Path) -> pd.DataFrame:
    """Stage 'respond': one system x one task over all stimuli of the task's languages."""
    from voicebias.io import read_json, read_table, write_json, write_table
    from voicebias.systems import build_system
    from voicebias.tasks import load_tasks

    if not read_json(gate_metrics).get("passed"):
        raise RuntimeError("the carrier gate has not passed; no system may hear these stimuli")
    manifest = read_table(manifest_path)
    passages = read_table(passages_path)
    sys_params = params["systems"].get(system_name)
    if sys_params is None:
        raise KeyError(f"params.yaml has no 'systems.{system_name}' section")
    system = build_system(system_name, sys_params, stimuli=manifest, passages=passages,
                          rate_wpm=params["tts"].get("rate_wpm", 160))
    task = load_tasks()[task_name]
    if out_dir.exists():
        shutil.rmtree(out_dir)  # the stage's output is rebuilt from the cache, never half-stale
    table, counts = run_task(system, task, manifest, out_dir, ResponseCache(cache_dir), int(params["base"]["seed"]), root)
    validate_responses(table)
    write_table(out_dir / "responses.csv", table)
    write_json(stats_path, counts)
    return table
