"""Repository-based adapters: clear setup messages, and the subprocess route run for real.

The real checkouts (Kimi-Audio, GLM-4-Voice, Step-Audio-2, SpiritLM, SpeechGPT,
VAE-GSLM) need GPUs and gated weights; here a fake checkout with the same importable
names stands in at the import boundary, so the shipped driver and the worker
protocol run as they would (see tests/fakes/checkouts.py).
"""

from __future__ import annotations

import sys

import pytest

from tests.fakes.checkouts import command_checkout, kimi_checkout, kimi_weights
from tests.fakes.stimuli import make_stimuli
from voicebias.cards import load_card
from voicebias.errors import SetupError
from voicebias.systems.base import ContinuationRequest, S2SRequest
from voicebias.systems.catalog import build_system
from voicebias.systems.runner import ResponseCache, RetryPolicy, run_task, validate_responses
from voicebias.tasks import Task, load_tasks

REPO_SYSTEMS = {
    "kimi_audio": "MoonshotAI/Kimi-Audio",
    "glm4_voice": "THUDM/GLM-4-Voice",
    "step_audio2": "stepfun-ai/Step-Audio2",
    "spiritlm_base": "facebookresearch/spiritlm",
    "spiritlm_expressive": "facebookresearch/spiritlm",
    "speechgpt": "0nutation/SpeechGPT",
    "vae_gslm": "b04901014/vae-gslm",
}


@pytest.mark.parametrize("name", sorted(REPO_SYSTEMS))
def test_missing_checkout_names_the_repository_and_the_fix(name, tmp_path):
    with pytest.raises(SetupError) as err:
        build_system(name, {}, root=tmp_path)
    msg = str(err.value)
    checkout = load_card(name)["requires"]["checkout"]
    assert f"a checkout of {REPO_SYSTEMS[name]}" in msg and checkout in msg and "git clone" in msg


def test_missing_weights_and_interpreter_are_named(tmp_path):
    (tmp_path / "external" / "Kimi-Audio").mkdir(parents=True)
    with pytest.raises(SetupError, match="Kimi-Audio-7B-Instruct"):
        build_system("kimi_audio", {}, root=tmp_path)
    (tmp_path / "models" / "weights" / "Kimi-Audio-7B-Instruct").mkdir(parents=True)
    with pytest.raises(SetupError, match="systems.kimi_audio.python"):
        build_system("kimi_audio", {}, root=tmp_path)


def kimi(tmp_path, **params):
    kimi_checkout(tmp_path / "external" / "Kimi-Audio")
    kimi_weights(tmp_path / "models" / "weights" / "Kimi-Audio-7B-Instruct")
    return build_system("kimi_audio", {"python": sys.executable, "startup_timeout_s": 60, **params}, root=tmp_path)


def test_worker_runs_the_driver_and_survives_crashes_hangs_and_errors(tmp_path):
    stim = make_stimuli(tmp_path, 5)
    prompts = {0: "say it", 1: "CRASH now", 2: "HANG now", 3: "RAISE now", 4: "say it again"}
    task = Task("describe", "test", "same", {"en": "unused"})
    system = kimi(tmp_path, timeout_s=3)
    policy = RetryPolicy(max_attempts=2, base_delay_s=0.0)
    from voicebias.systems.runner import call_with_retries

    results = {}
    try:
        for i, s in stim.iterrows():
            req = S2SRequest(s.stimulus_id, "en", "en", task.name, prompts[i], str(tmp_path / s.path), s.sha256, 1)
            results[i] = call_with_retries(system, req, policy)
    finally:
        system.close()
    ok, n = results[0]
    assert ok.status == "ok" and n == 1 and ok.transcript == "heard 4000 samples; prompt: say it"
    assert ok.sample_rate == 24000 and ok.audio.size == 12000
    assert ok.provenance["repository"] == "MoonshotAI/Kimi-Audio"
    assert ok.provenance["model_revision"] == "Kimi-Audio-7B-Instruct"
    crash, n = results[1]
    assert crash.status == "failed" and n == 2 and "worker died (exit code 3)" in crash.error
    hang, n = results[2]
    assert hang.status == "failed" and n == 2 and "no answer within 3 s" in hang.error
    err, n = results[3]
    assert err.status == "failed" and n == 1 and "input too long" in err.error  # reported, not retried
    after, _ = results[4]
    assert after.status == "ok"  # the worker was restarted after the crash and the hang


def test_a_worker_that_cannot_load_stops_the_stage_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_KIMI_FAIL_LOAD", "1")
    monkeypatch.setenv("VOICEBIAS_CHILD_ENV", "FAKE_KIMI_FAIL_LOAD")  # named, so the worker sees it
    stim = make_stimuli(tmp_path, 3)
    system = kimi(tmp_path)
    with pytest.raises(SetupError, match="flash_attn"):
        run_task(
            system,
            load_tasks()["describe"],
            stim,
            tmp_path / "o",
            ResponseCache(tmp_path / "c"),
            1,
            tmp_path,
            progress=False,
        )
    system.close()


def test_cached_rerun_never_starts_the_model(tmp_path):
    stim = make_stimuli(tmp_path, 2)
    cache = ResponseCache(tmp_path / "c")
    system = kimi(tmp_path)
    table, _ = run_task(system, load_tasks()["describe"], stim, tmp_path / "o", cache, 1, tmp_path, progress=False)
    system.close()
    validate_responses(table)
    assert table.transcript.str.contains("Listen to the speaker").all()  # the native prompt reached the model
    again = kimi_again = build_system("kimi_audio", {"python": sys.executable}, root=tmp_path)
    _, counts = run_task(again, load_tasks()["describe"], stim, tmp_path / "o2", cache, 1, tmp_path, progress=False)
    assert counts["cache_hits"] == 2 and kimi_again.backend.worker is None


def test_command_route_continues_a_prompt(tmp_path):
    """A `command` in the system's params replaces its driver: one process per prompt."""
    command_checkout(tmp_path / "external" / "vae-gslm")
    (tmp_path / "models" / "weights" / "vae-gslm").mkdir(parents=True)
    system = build_system(
        "vae_gslm",
        {
            "python": sys.executable,
            "command": ["python", "continue.py", "{audio}", "{out}", "{text_out}", "{continuation_s}"],
        },
        root=tmp_path,
    )
    assert system.kind == "continuation"
    s = make_stimuli(tmp_path, 1).iloc[0]
    resp = system.continue_speech(
        ContinuationRequest(s.stimulus_id, "en", "continue", str(tmp_path / s.path), s.sha256, 1, continuation_s=6.0)
    )
    system.close()
    assert resp.status == "ok" and abs(resp.audio.size / resp.sample_rate - 6.0) < 1e-3
    assert resp.transcript == "and then she went home"
