"""`voicebias serve`: the shim run for real in a bare environment, and the vLLM-Omni command lines.

The shim must run where voicebias is not installed (a system's own environment), so the
test makes a virtual environment with the standard library alone (`venv --without-pip`)
and a stand-in driver (tests/fakes/stand_in_driver.py, never shipped) that speaks the
driver line protocol: it answers with the input audio reversed and a transcript naming
the hash of the input samples, and refuses any prompt holding FAIL. Two replicas are
started with the CLI, asked through the real openai_compatible adapter, and stopped again
(tests/unit/systems/test_repository_served.py asks them through the repository adapter).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml

from tests.fakes.stand_in_driver import bare_python, stand_in_driver
from tests.support.servers import free_port_block
from voicebias.cards import load_card
from voicebias.cli import main
from voicebias.cli.serve import ServeError, plan, record, vllm_command
from voicebias.config import CARDS_DIR
from voicebias.systems.base import S2SRequest
from voicebias.systems.catalog import build_system
from voicebias.systems.runner import RetryPolicy, call_with_retries


def _pids(root: Path) -> dict:
    return json.loads((root / ".cache" / "serve" / "pids.json").read_text())


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _health(url: str) -> int:
    try:
        with urllib.request.urlopen(url.removesuffix("/v1") + "/health", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return -1


def test_serve_starts_replicas_of_a_repository_system_in_its_own_environment(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    (root / "external" / "Kimi-Audio").mkdir(parents=True)
    (root / "models" / "weights" / "Kimi-Audio-7B-Instruct").mkdir(parents=True)
    driver = stand_in_driver(tmp_path)
    python = bare_python(tmp_path)
    for var in ("PYTHONPATH", "VOICEBIAS_ENDPOINTS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("VOICEBIAS_ROOT", str(root))
    monkeypatch.setenv("VOICEBIAS_CACHE", str(root / ".cache"))
    endpoints_path = root / ".cache" / "endpoints.json"
    endpoints_path.parent.mkdir(parents=True)
    other = {"other_system": [{"url": "http://gpu-x:8000/v1", "weight": 1, "max_concurrency": 4}]}
    endpoints_path.write_text(json.dumps(other))

    port = free_port_block(2)
    assert (
        main(
            [
                "serve",
                "kimi_audio",
                "--replicas",
                "2",
                "--port-base",
                str(port),
                "--python",
                python,
                "--driver",
                str(driver),
                "--startup-timeout",
                "30",
                "--grace",
                "5",
            ]
        )
        == 0
    )
    try:
        entries = _pids(root)["kimi_audio"]
        urls = [f"http://127.0.0.1:{port}/v1", f"http://127.0.0.1:{port + 1}/v1"]
        assert [e["url"] for e in entries] == urls
        assert all(_health(u) == 200 for u in urls)
        listed = json.loads(endpoints_path.read_text())
        assert [e["url"] for e in listed["kimi_audio"]] == urls
        assert listed["other_system"] == other["other_system"]  # entries of other systems kept
        (token,) = {e["token"] for e in listed["kimi_audio"]}  # one per system, for its shims alone
        assert _status(urls[0] + "/models") == 401
        req = urllib.request.Request(urls[0] + "/models", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=5) as r:
            info = json.loads(r.read())["data"][0]
        assert info["id"] == "moonshotai/Kimi-Audio-7B-Instruct"
        # the driver ran in the bare environment, from the checkout (the stand-in names both)
        assert info["info"]["environment"] == "system-env" and info["info"]["voicebias_importable"] is False
        assert info["info"]["checkout"] == "Kimi-Audio"

        # the audit's side: the openai_compatible adapter, its endpoints from the endpoints file
        cards = tmp_path / "cards"
        cards.mkdir()
        card = load_card("kimi_audio")
        card["adapter"] = "openai_compatible"
        (cards / "kimi_audio.yaml").write_text(yaml.safe_dump(card))
        system = build_system("kimi_audio", {"send_seed": True, "timeout_s": 20}, cards_dir=cards, root=root)
        assert system.endpoints_source == str(endpoints_path) and len(system.endpoints) == 2
        rng = np.random.default_rng(7)
        results = []
        try:
            for i in range(5):
                x = (rng.uniform(-0.5, 0.5, 4000 + 100 * i) * 32767).astype("<i2")
                path = tmp_path / f"s{i}.wav"
                sf.write(path, x, 16000, subtype="PCM_16")
                prompt = "FAIL on purpose" if i == 3 else f"describe {i}"
                req = S2SRequest(f"s{i}", "en", "en", "describe", prompt, str(path), "unused", 100 + i)
                resp, attempts = call_with_retries(system, req, RetryPolicy(max_attempts=2, base_delay_s=0.0))
                results.append((x, resp, attempts))
            stats = system.pool.stats()
        finally:
            system.close()
        for i, (x, resp, attempts) in enumerate(results):
            if i == 3:
                assert resp.status == "failed" and attempts == 1  # recorded as failed at once, nothing filled in
                assert "HTTP 422" in resp.error and "the stand-in refuses this input" in resp.error
                assert resp.audio is None
                continue
            assert resp.status == "ok" and attempts == 1
            assert resp.sample_rate == 16000
            np.testing.assert_array_equal(np.round(resp.audio * 32768).astype(np.int64), x[::-1].astype(np.int64))
            digest = hashlib.sha256(x.tobytes()).hexdigest()[:16]
            assert resp.transcript == f"input {digest} seed {100 + i} prompt describe {i}"
            assert resp.provenance["system_fingerprint"] == "stand-in-1"
        assert [s["sent"] for s in stats] == [3, 2] and all(s["answered"] for s in stats)  # both replicas served

        # an input the driver protocol does not take is refused, not resampled
        sf.write(tmp_path / "s24k.wav", np.zeros(2400), 24000, subtype="PCM_16")
        system = build_system("kimi_audio", {"timeout_s": 20}, cards_dir=cards, root=root)
        try:
            resp, _ = call_with_retries(
                system,
                S2SRequest("x", "en", "en", "describe", "p", str(tmp_path / "s24k.wav"), "unused", 1),
                RetryPolicy(max_attempts=1),
            )
        finally:
            system.close()
        assert resp.status == "failed" and "HTTP 400" in resp.error and "16 kHz" in resp.error

        with pytest.raises(SystemExit):  # a second start of a served system is refused
            main(["serve", "kimi_audio", "--port-base", str(port + 5), "--python", python, "--driver", str(driver)])
    finally:
        pids = [e["pid"] for e in _pids(root).get("kimi_audio", [])]
        assert main(["serve", "--stop", "--grace", "5"]) == 0
    deadline = time.monotonic() + 5
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pids and all(_gone(p) for p in pids)
    assert json.loads(endpoints_path.read_text()) == other
    assert _pids(root) == {}


def test_a_driver_that_cannot_load_stops_serve_with_its_log(tmp_path, monkeypatch):
    root = tmp_path / "proj"
    (root / "external" / "Kimi-Audio").mkdir(parents=True)
    (root / "models" / "weights" / "Kimi-Audio-7B-Instruct").mkdir(parents=True)
    driver = tmp_path / "broken_driver.py"
    driver.write_text("import sys\nprint('flash_attn is missing', file=sys.stderr)\nsys.exit(3)\n")
    monkeypatch.setenv("VOICEBIAS_ROOT", str(root))
    monkeypatch.setenv("VOICEBIAS_CACHE", str(root / ".cache"))
    monkeypatch.delenv("VOICEBIAS_ENDPOINTS", raising=False)
    import argparse

    from voicebias.cli.serve import cmd_serve  # noqa: F401  (the error, not the exit, is checked)

    args = argparse.Namespace(
        stop=False,
        systems=["kimi_audio"],
        replicas=1,
        gpus=None,
        gpus_per_replica=1,
        port_base=free_port_block(1),
        host="127.0.0.1",
        python=sys.executable,
        driver=str(driver),
        max_concurrency=None,
        startup_timeout=20.0,
        grace=2.0,
    )
    with pytest.raises(ServeError, match="(?s)exited with code 1.*flash_attn is missing"):
        cmd_serve(args)
    assert not (root / ".cache" / "endpoints.json").exists()


def _vllm_cards(tmp_path: Path, **changes) -> Path:
    cards = tmp_path / "cards"
    cards.mkdir(exist_ok=True)
    for name in ("qwen2_5_omni_vllm", "step_audio2_vllm"):
        card = yaml.safe_load((CARDS_DIR / f"{name}.yaml").read_text())
        card["revision"] = "0123456789abcdef0123456789abcdef01234567"
        card.update(changes.get(name, {}))
        (cards / f"{name}.yaml").write_text(yaml.safe_dump(card))
    return cards


def test_vllm_command_lines_from_the_cards(tmp_path):
    cards = _vllm_cards(tmp_path)
    reps = plan(
        ["qwen2_5_omni_vllm", "step_audio2_vllm"],
        {},
        tmp_path,
        tmp_path / "serve",
        replicas=2,
        gpus="0,1,2",
        port_base=9100,
        cards_dir=cards,
    )
    assert [(r.system, r.index, r.port, r.gpus) for r in reps] == [
        ("qwen2_5_omni_vllm", 0, 9100, "0"),
        ("qwen2_5_omni_vllm", 1, 9101, "1"),
        ("step_audio2_vllm", 0, 9102, "2"),
        ("step_audio2_vllm", 1, 9103, "0"),
    ]
    rev = "0123456789abcdef0123456789abcdef01234567"
    q = reps[1].argv
    assert q[:3] == ["vllm", "serve", "Qwen/Qwen2.5-Omni-7B"] and "--omni" in q
    assert q[q.index("--revision") + 1] == rev and q.count("--port") == 1 and q[q.index("--port") + 1] == "9101"
    assert q[q.index("--host") + 1] == "127.0.0.1" and "<revision>" not in " ".join(q)
    assert reps[1].env["VLLM_BATCH_INVARIANT"] == "1" and reps[1].env["CUDA_VISIBLE_DEVICES"] == "1"
    assert reps[1].url == "http://127.0.0.1:9101/v1" and reps[1].max_concurrency == 8
    # the endpoints file records the revision each server was started with, for the adapter to check
    record(reps, tmp_path / "endpoints.json", tmp_path / "serve")
    written = json.loads((tmp_path / "endpoints.json").read_text())
    assert [e["revision"] for e in written["qwen2_5_omni_vllm"]] == [rev, rev]
    s = reps[2].argv
    assert s[2] == "stepfun-ai/Step-Audio-2-mini" and "--omni" in s and "--trust-remote-code" in s
    assert s[s.index("--deploy-config") + 1] == "vllm_omni/deploy/step_audio2.yaml"
    two = plan(
        ["step_audio2_vllm"],
        {"step_audio2_vllm": {"deploy": {"batch_invariant": False}}},
        tmp_path,
        tmp_path / "serve",
        gpus="0,1,2,3",
        gpus_per_replica=2,
        replicas=2,
        port_base=9200,
        cards_dir=cards,
        python="/envs/omni/bin/python",
    )
    assert [r.gpus for r in two] == ["0,1", "2,3"] and "VLLM_BATCH_INVARIANT" not in two[0].env
    assert two[0].argv[0] == "/envs/omni/bin/vllm"


def test_an_unpinned_vllm_card_is_refused(tmp_path):
    card = yaml.safe_load((CARDS_DIR / "qwen2_5_omni_vllm.yaml").read_text())
    with pytest.raises(ServeError, match="pins no revision"):
        vllm_command(card, 9000)
