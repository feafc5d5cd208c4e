"""Repository systems served over HTTP: `voicebias serve` starts the shim around a driver, in the
driver's own bare environment on loopback, and the system's own adapter sends its requests there.

What users rely on: with the endpoints `voicebias serve` writes, a repository system needs no
checkout, environment or weights on the auditing side; a request comes back with the driver's
audio and transcript; the stage's outputs (responses.csv with its cache keys, and the audio
files) are byte-identical to running the same driver as a local worker; a driver error for one
input, and a shim reply without audio, are recorded as that input's failure; a continuation
system's settings reach the driver; and a shim that runs the driver with other settings than the
params give is refused before any call, naming the endpoint. The driver is the stand-in of
tests/fakes/stand_in_driver.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.fakes.stand_in_driver import bare_python, stand_in_driver
from tests.fakes.stimuli import make_stimuli
from tests.support.respond import run
from tests.support.servers import free_port, free_port_block
from voicebias.audio import read_audio
from voicebias.cli import main
from voicebias.errors import SetupError
from voicebias.systems.base import ContinuationRequest, S2SRequest
from voicebias.systems.catalog import build_system
from voicebias.systems.runner import RetryPolicy, call_with_retries, validate_responses
from voicebias.tasks import load_tasks

SYSTEMS = {
    "kimi_audio": ("external/Kimi-Audio", "models/weights/Kimi-Audio-7B-Instruct"),
    "vae_gslm": ("external/vae-gslm", "models/weights/vae-gslm"),
}


@pytest.fixture
def served(tmp_path, monkeypatch):
    """(serving root, audit root, interpreter, driver, endpoints file, port): kimi_audio and vae_gslm served
    by two and one shims of the stand-in driver, stopped again at the end."""
    proj, audit = tmp_path / "proj", tmp_path / "audit"
    for checkout, weights in SYSTEMS.values():
        (proj / checkout).mkdir(parents=True)
        (proj / weights).mkdir(parents=True)
    audit.mkdir()
    driver, python = stand_in_driver(tmp_path), bare_python(tmp_path)
    endpoints = proj / ".cache" / "endpoints.json"
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("VOICEBIAS_ROOT", str(proj))
    monkeypatch.setenv("VOICEBIAS_CACHE", str(proj / ".cache"))
    monkeypatch.setenv("VOICEBIAS_ENDPOINTS", str(tmp_path / "not-yet.json"))
    port = free_port_block(2)
    yield proj, audit, python, driver, endpoints, port
    monkeypatch.setenv("VOICEBIAS_ENDPOINTS", str(endpoints))
    if (proj / ".cache" / "serve" / "pids.json").exists():
        assert main(["serve", "--stop", "--grace", "5"]) == 0


def serve(endpoints, monkeypatch, *argv) -> None:
    monkeypatch.setenv("VOICEBIAS_ENDPOINTS", str(endpoints))
    assert main(["serve", *argv, "--startup-timeout", "30", "--grace", "5"]) == 0


def requests_for(stim, root, prompt):
    return [
        S2SRequest(s.stimulus_id, s.lang, s.lang, "describe", prompt, str(root / s.path), s.sha256, 3)
        for s in stim.itertuples()
    ]


def test_served_repository_system_answers_as_its_local_worker_byte_for_byte(served, monkeypatch):
    proj, audit, python, driver, endpoints, port = served
    stim = make_stimuli(audit, 8)
    prompt = load_tasks()["describe"].prompt("en")

    # the driver as a local worker, in its own bare environment, from the checkout in proj
    local = build_system("kimi_audio", {"python": python, "driver": str(driver), "startup_timeout_s": 30}, root=proj)
    assert local.backend.served is None and local.max_concurrency == 1
    table_w, counts_w, _, files_w = run(local, stim, audit, audit / "cache-worker")
    local.close()
    assert (table_w.status == "ok").all() and counts_w["calls"] == 8

    # the same driver behind two shims; the audit side has no checkout, environment or weights
    serve(
        endpoints,
        monkeypatch,
        "kimi_audio",
        "--replicas",
        "2",
        "--port-base",
        str(port),
        "--python",
        python,
        "--driver",
        str(driver),
    )
    remote = build_system("kimi_audio", {"timeout_s": 20}, root=audit)
    assert remote.backend.served is not None and remote.backend.served.source == str(endpoints)
    assert remote.max_concurrency == 2 and not (audit / "external").exists()
    table_s, counts_s, _, files_s = run(remote, stim, audit, audit / "cache-served")
    stats = remote.run_facts()["endpoints"]
    remote.close()

    assert (table_s.status == "ok").all() and counts_s["calls"] == 8 and counts_s["failed"] == 0
    validate_responses(table_s)
    assert sum(e["answered"] for e in stats) == 8 and all(e["answered"] for e in stats)  # both shims answered
    assert table_s.cache_key.tolist() == table_w.cache_key.tolist()  # same driver, settings, inputs: same key
    assert "driver_sha256" in remote.generation_settings()  # the stand-in is not the shipped driver
    assert sorted(files_s) == sorted(files_w) and len(files_w) == 9
    for name in files_w:
        assert files_s[name] == files_w[name], name
    csv = files_s["responses.csv"].decode()
    assert f"127.0.0.1:{port}" not in csv and "stand-in-1" in csv
    row = table_s.iloc[0]
    assert row.transcript.startswith("input ") and row.transcript.endswith(f"seed 1 prompt {prompt}")
    prov = json.loads(row.provenance)
    assert prov["environment"] == "system-env" and prov["checkout"] == "Kimi-Audio"  # what the driver told
    assert str(proj) not in csv and python not in csv  # no path of the machine that ran it
    assert prov["voicebias_importable"] is False and row.model_revision == "stand-in-1"
    x, sr = read_audio(audit / stim.set_index("stimulus_id").loc[row.stimulus_id, "path"])
    y, sr_out = read_audio(audit / row.output_audio)
    assert sr_out == sr == 16000
    np.testing.assert_array_equal(np.round(y * 32768), np.round(x[::-1] * 32768))  # the driver's own output


def test_driver_errors_and_replies_without_audio_are_recorded_failures(served, monkeypatch):
    proj, audit, python, driver, endpoints, port = served
    serve(
        endpoints,
        monkeypatch,
        "kimi_audio",
        "vae_gslm",
        "--port-base",
        str(port),
        "--python",
        python,
        "--driver",
        str(driver),
    )
    stim = make_stimuli(audit, 3)
    s2s = build_system("kimi_audio", {"timeout_s": 20}, root=audit)
    policy = RetryPolicy(max_attempts=2, base_delay_s=0.0)
    prompts = ["describe", "FAIL on purpose", "NOAUDIO please"]
    try:
        ok, refused, silent = [
            call_with_retries(s2s, requests_for(stim, audit, p)[i], policy) for i, p in enumerate(prompts)
        ]
    finally:
        s2s.close()
    resp, attempts = ok
    assert resp.status == "ok" and attempts == 1 and resp.sample_rate == 16000 and resp.audio.size == 4000
    assert resp.transcript.endswith("seed 3 prompt describe") and resp.provenance["endpoint"].endswith(f":{port}/v1")
    resp, attempts = refused  # HTTP 422 from the shim: the driver's own message, not retried
    assert resp.status == "failed" and attempts == 1 and resp.error == "the stand-in refuses this input"
    assert resp.audio is None and resp.transcript is None
    resp, attempts = silent  # a 200 reply whose audio is empty
    assert resp.status == "failed" and attempts == 1 and resp.error.startswith("the shim's reply has no audio")
    assert resp.audio is None

    sc = build_system("vae_gslm", {"timeout_s": 20}, root=audit)
    assert sc.kind == "continuation" and sc.backend.served is not None
    s = stim.iloc[0]
    try:
        resp = sc.continue_speech(
            ContinuationRequest(s.stimulus_id, "en", "continue", str(audit / s.path), s.sha256, 5, continuation_s=4.0)
        )
    finally:
        sc.close()
    assert resp.status == "ok" and resp.transcript.endswith("seed 5 prompt  continuation_s 4.0")


def test_a_shim_with_other_settings_is_refused_naming_the_endpoint(served, monkeypatch):
    proj, audit, python, driver, endpoints, port = served
    serve(endpoints, monkeypatch, "kimi_audio", "--port-base", str(port), "--python", python, "--driver", str(driver))
    hotter = build_system("kimi_audio", {"sampling": {"audio_temperature": 0.9}}, root=audit)
    with pytest.raises(
        SetupError,
        match=rf"endpoint http://127.0.0.1:{port}/v1 runs its driver with settings "
        r"\{.*\}; this system's params give .*audio_temperature",
    ):
        hotter.generation_settings()
    hotter.close()
    monkeypatch.setenv("VOICEBIAS_ENDPOINTS", str(audit / "none.json"))  # the endpoints file would win over params
    stopped = build_system("kimi_audio", {"endpoints": [{"url": f"http://127.0.0.1:{free_port()}/v1"}]}, root=audit)
    with pytest.raises(SetupError, match="no shim answers at .*voicebias serve kimi_audio"):
        stopped.generation_settings()
    stopped.close()
