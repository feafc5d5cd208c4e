"""The respond stage's failure policy, the ledger of failed calls and the pending_calls stage, on a
scratch project whose one system (gpt_audio) is served by a fake OpenAI audio server (real HTTP).

What users rely on: above `run.max_failed_fraction` the stage stops with one line naming the
system, the task, the failed count and the commonest reasons, and the finished calls stay
cached; at or below it the failures are counted exclusions; either way the next `dvc repro`
(no -f) sends the failed calls again and only those; with every endpoint refusing, the stage
stops in seconds with one line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.fakes.openai_server import FakeOpenAIAudioServer, fingerprint_file
from tests.fakes.stimuli import make_stimuli
from voicebias import config
from voicebias.errors import StageFailed
from voicebias.params import ParamsError, Run, max_failed_fraction, validate_section
from voicebias.pipeline import pending_calls
from voicebias.pipeline.calls import over_limit
from voicebias.pipeline.respond import run_stage

KEY = "sk-test-policy-0123456789abcdefPLANTED"
REPO = config.ROOT


def project(root: Path, n: int, system_params: dict) -> tuple[pd.DataFrame, dict]:
    """A scratch project: n stimuli, the carrier gate passed, gpt_audio's card, params.yaml (embedded
    profile with gpt_audio as the only system). Returns (stimuli, params)."""
    stim = make_stimuli(root, n)
    stim.to_csv(root / "data" / "stimuli" / "manifest.csv", index=False)
    (root / "data" / "passages").mkdir(parents=True)
    pd.DataFrame({"passage_id": stim["passage_id"]}).to_csv(root / "data" / "passages" / "passages.csv", index=False)
    (root / "reports" / "carrier_gate").mkdir(parents=True)
    (root / "reports" / "carrier_gate" / "metrics.json").write_text('{"passed": true}')
    shutil.copytree(config.TASKS_DIR, root / "data" / "tasks")
    (root / "models" / "cards").mkdir(parents=True)
    shutil.copy(config.CARDS_DIR / "gpt_audio.yaml", root / "models" / "cards")
    params = yaml.safe_load((config.PROFILES_DIR / "embedded.yaml").read_text(encoding="utf-8"))
    params["run"] = {
        "systems": ["gpt_audio"],
        "sc_systems": [],
        "samples_per_item": 1,
        "max_failed_fraction": 0.05,
        "max_reply_ratio": 4,
        # no determinism probe: these tests count the calls of the failure policy alone (the probe's own
        # calls are tested in tests/unit/systems/test_vllm_omni.py and tests/unit/systems/test_runner.py)
        "determinism_probe": 0,
    }
    params["systems"] = {"gpt_audio": {"model": "gpt-4o-audio-preview", "timeout_s": 10, **system_params}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return stim, params


def respond(params: dict, root: Path) -> pd.DataFrame:
    """The respond stage in this process, on the describe task."""
    return run_stage(
        params,
        system="gpt_audio",
        manifest_path=root / "data" / "stimuli" / "manifest.csv",
        passages_path=root / "data" / "passages" / "passages.csv",
        gate_metrics=root / "reports" / "carrier_gate" / "metrics.json",
        responses_dir_for=lambda t: root / "data" / "responses" / "gpt_audio" / t,
        report_for=lambda t: root / "reports" / "respond" / "gpt_audio" / f"{t}.json",
        planted_truth_path=root / "reports" / "respond" / "gpt_audio" / "planted_truth.json",
        cache_dir=root / ".cache" / "responses",
        root=root,
        task_names=["describe"],
    )["describe"]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    import voicebias.runlog

    monkeypatch.setattr(voicebias.runlog, "RUN_LOG", tmp_path / "runs.jsonl")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("VOICEBIAS_ENDPOINTS", str(tmp_path / "no-endpoints.json"))
    return tmp_path / "proj"


def sent(server, since: int = 0) -> list[str]:
    server.wait_idle()
    return [e.fingerprint for e in server.log[since:]]


def test_over_the_limit_the_stage_stops_with_one_line_and_the_next_run_sends_only_the_failed(scratch):
    root = scratch
    with FakeOpenAIAudioServer(KEY) as server:
        stim, params = project(root, 30, {"base_url": server.base_url})
        fps = [fingerprint_file(root / p) for p in stim["path"]]
        server.plan = {fps[0]: ["400"], fps[1]: ["400"], fps[2]: ["noaudio"]}
        with pytest.raises(StageFailed) as info:
            respond(params, root)
        first = sent(server)
        msg = str(info.value)
        assert msg == (
            "system 'gpt_audio': describe: 3 of 30 calls failed: 2 x RuntimeError: HTTP 400: "
            "Error code: 400 - Invalid input "
            "audio., 1 x reply has no audio (finish_reason stop); the model wrote: I can't help with that. "
            "(more than run.max_failed_fraction 0.05; the finished calls are cached and the next run sends "
            "only the failed ones)"
        )
        # the outputs of this run are written and the 27 answers cached; the ledger holds the 3 failed calls
        table = pd.read_csv(root / "data" / "responses" / "gpt_audio" / "describe" / "responses.csv")
        failed_keys = sorted(table.loc[table.status == "failed", "cache_key"])
        assert len(failed_keys) == 3 and (table.status == "ok").sum() == 27
        ledger = pending_calls.read_ledger(root / ".cache" / "responses", "gpt_audio")
        assert ledger == {"round": 1, "tasks": {"describe": failed_keys}}
        assert pending_calls.pending(root / ".cache" / "responses", "gpt_audio") == {
            "failed_calls": 3,
            "round": 1,
            "system": "gpt_audio",
        }

        again = respond(params, root)  # the plans are spent: the three get through
        second = sent(server, len(first))
    assert sorted(second) == sorted(fps[:3])  # only the failed calls were sent again
    assert len(first) == 30 and (again.status == "ok").all()
    assert pending_calls.read_ledger(root / ".cache" / "responses", "gpt_audio") is None
    assert not pending_calls.ledger_path(root / ".cache" / "responses", "gpt_audio").exists()


def test_at_or_below_the_limit_failures_are_counted_exclusions_and_the_round_counts_runs(scratch):
    root = scratch
    with FakeOpenAIAudioServer(KEY) as server:
        stim, params = project(root, 20, {"base_url": server.base_url})
        fp = fingerprint_file(root / stim["path"][4])
        server.plan = {fp: ["400", "400"]}
        cache = root / ".cache" / "responses"
        rounds = []
        for _ in range(3):  # 1 of 20 is exactly 0.05: at the limit, the stage succeeds
            table = respond(params, root)
            rounds.append((int((table.status == "failed").sum()), pending_calls.pending(cache, "gpt_audio")))
        stats = json.loads((root / "reports" / "respond" / "gpt_audio" / "describe.json").read_text())
    assert [r[0] for r in rounds] == [1, 1, 0]
    assert [r[1] for r in rounds] == [
        {"failed_calls": 1, "round": 1, "system": "gpt_audio"},
        {"failed_calls": 1, "round": 2, "system": "gpt_audio"},
        {"failed_calls": 0, "round": 0, "system": "gpt_audio"},
    ]
    assert stats == {"requests": 20, "shared": 0, "failed": 0, "excluded": 0}
    assert server.attempts[fp] == 3 and sum(server.attempts.values()) == 22  # 20, then the one, then it again


def test_every_endpoint_refusing_stops_the_stage_in_seconds_with_one_line(tmp_path):
    """`python -m stages.respond` against a port nothing listens on, with one endpoint and with two."""
    root = tmp_path / "proj"
    with FakeOpenAIAudioServer(KEY) as a, FakeOpenAIAudioServer(KEY) as b:
        urls = [a.base_url, b.base_url]
    project(
        root,
        30,
        {
            "base_url": urls[0],
            "max_concurrency": 8,
            "timeout_s": 120,
            "retry": {"max_attempts": 5, "base_delay_s": 2.0, "max_delay_s": 60.0},
        },
    )
    env = {
        **os.environ,
        "VOICEBIAS_ROOT": str(root),
        "VOICEBIAS_CACHE": str(root / ".cache"),
        "OPENAI_API_KEY": KEY,
        "PYTHONPATH": str(REPO),
    }
    cmd = [sys.executable, "-m", "stages.respond", "--system", "gpt_audio", "--task", "describe"]
    seconds = []
    for spec in ({"base_url": urls[0]}, {"endpoints": [{"url": u} for u in urls]}):
        params = yaml.safe_load((root / "params.yaml").read_text())
        params["systems"]["gpt_audio"].pop("base_url", None)
        params["systems"]["gpt_audio"].update(spec)
        (root / "params.yaml").write_text(yaml.safe_dump(params))
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        seconds.append(time.perf_counter() - t0)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert lines[0].startswith("voicebias respond gpt_audio: system 'gpt_audio': cannot reach ")
        assert lines[0].count("(connection refused)") == len(spec.get("endpoints", [1]))
        assert not (root / "data" / "responses" / "gpt_audio" / "describe" / "responses.csv").exists()
    # the same through `dvc repro`: it exits non-zero, our one line in its output, and records nothing
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    (root / "dvc.yaml").write_text(
        yaml.safe_dump(
            {
                "stages": {
                    "pending_calls": {k: spec["pending_calls"][k] for k in ("cmd", "always_changed", "params", "outs")},
                    "respond": {
                        "foreach": ["gpt_audio"],
                        "do": {
                            "cmd": spec["respond"]["do"]["cmd"] + " --task describe",
                            "deps": ["reports/pending_calls/${item}.json"],
                            "params": spec["respond"]["do"]["params"],
                            "outs": spec["respond"]["do"]["outs"],
                        },
                    },
                }
            }
        )
    )
    env = {
        **env,
        "DVC_NO_ANALYTICS": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    subprocess.run(["dvc", "init", "--no-scm", "-q"], cwd=root, env=env, check=True)
    t0 = time.perf_counter()
    done = subprocess.run(["dvc", "repro"], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    seconds.append(time.perf_counter() - t0)
    ours = [line for line in done.stderr.splitlines() if line.startswith("voicebias respond gpt_audio:")]
    assert done.returncode != 0 and len(ours) == 1 and "cannot reach" in ours[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    lock = root / "dvc.lock"
    assert not lock.exists() or "respond@gpt_audio" not in lock.read_text()  # DVC did not record it as done
    assert seconds[2] < 60
    print(
        f"\nevery endpoint refusing: the respond stage exited in {seconds[0]:.2f} s (one endpoint), "
        f"{seconds[1]:.2f} s (two); dvc repro exited {done.returncode} in {seconds[2]:.2f} s"
    )


def test_repeated_dvc_repro_sends_the_failed_calls_again_without_force(tmp_path):
    """The real pending_calls and respond stages in a scratch DVC project: a run over the limit fails,
    the next succeeds with one failure left (a counted exclusion), the next sends only that one, and
    once none is left the stages settle."""
    root = tmp_path / "proj"
    with FakeOpenAIAudioServer(KEY) as server:
        stim, _ = project(root, 30, {"base_url": server.base_url})
        fps = [fingerprint_file(root / p) for p in stim["path"]]
        server.plan = {fps[0]: ["400"], fps[1]: ["400"], fps[2]: ["400", "400"]}
        spec = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
        respond_stage = spec["respond"]
        (root / "dvc.yaml").write_text(
            yaml.safe_dump(
                {
                    "stages": {
                        "pending_calls": {
                            k: spec["pending_calls"][k] for k in ("cmd", "always_changed", "params", "outs")
                        },
                        "respond": {
                            "foreach": ["gpt_audio"],
                            "do": {
                                "cmd": respond_stage["do"]["cmd"] + " --task describe",
                                "deps": ["reports/pending_calls/${item}.json"],
                                "params": respond_stage["do"]["params"],
                                "outs": respond_stage["do"]["outs"],
                            },
                        },
                    }
                }
            )
        )
        env = {
            **os.environ,
            "VOICEBIAS_ROOT": str(root),
            "VOICEBIAS_CACHE": str(root / ".cache"),
            "OPENAI_API_KEY": KEY,
            "PYTHONPATH": str(REPO),
            "DVC_NO_ANALYTICS": "1",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }

        def dvc(*args):
            return subprocess.run(["dvc", *args], cwd=root, env=env, capture_output=True, text=True, timeout=600)

        assert dvc("init", "--no-scm", "-q").returncode == 0
        runs = []
        for _ in range(5):
            n = len(server.log)
            res = dvc("repro")
            ran = [line.split("'")[1] for line in res.stdout.splitlines() if line.startswith("Running stage")]
            pending = json.loads((root / "reports" / "pending_calls" / "gpt_audio.json").read_text())
            runs.append((res.returncode, ran, sorted(sent(server, n)), pending, res.stderr))
    codes, ran, sends, pending, stderr = zip(*runs)
    # 1: 3 of 30 failed, over 0.05: the stage stops (DVC does not record it), one line names the failures
    assert codes[0] != 0 and sends[0] == sorted(fps), (runs[0][1], stderr[0][-3000:])
    assert (
        "voicebias respond gpt_audio: system 'gpt_audio': describe: 3 of 30 calls failed: 3 x RuntimeError: "
        "HTTP 400: Error code: 400 - Invalid input audio. (more than run.max_failed_fraction 0.05" in stderr[0]
    )
    # 2: only the three are sent; one fails again, 1 of 30 is within the limit: a counted exclusion
    assert (
        codes[1] == 0
        and sends[1] == sorted(fps[:3])
        and pending[1] == {"failed_calls": 3, "round": 1, "system": "gpt_audio"}
    )
    # 3: no -f, yet respond runs again (its pending file changed) and sends only the one left
    assert codes[2] == 0 and ran[2] == ["pending_calls", "respond@gpt_audio"] and sends[2] == [fps[2]]
    assert pending[2] == {"failed_calls": 1, "round": 2, "system": "gpt_audio"}
    # 4: nothing is pending any more: the file goes back to zeros, respond runs once more sending nothing
    assert ran[3] == ["pending_calls", "respond@gpt_audio"] and sends[3] == []
    assert pending[3] == {"failed_calls": 0, "round": 0, "system": "gpt_audio"}
    # 5: settled: only the always-changed check runs, its file unchanged, and nothing downstream
    assert codes[4] == 0 and ran[4] == ["pending_calls"] and sends[4] == [] and pending[4] == pending[3]


# ---------------------------------------------------------------------------- the settings


def test_max_failed_fraction_is_a_share_with_a_documented_default():
    assert max_failed_fraction({"run": {"systems": []}}) == 0.05
    assert max_failed_fraction({"run": {"systems": [], "max_failed_fraction": 0.2}}) == 0.2
    for bad in (1.5, -0.1, "high"):
        with pytest.raises(ParamsError, match="run.max_failed_fraction"):
            validate_section(Run, {"systems": [], "max_failed_fraction": bad}, "run")
    for name in ("params.yaml", "profiles/embedded.yaml", "profiles/paper.yaml"):
        run = yaml.safe_load((REPO / name).read_text(encoding="utf-8"))["run"]
        assert run["max_failed_fraction"] == 0.05, name


def test_the_stages_that_call_systems_follow_their_pending_file():
    spec = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    assert spec["pending_calls"]["always_changed"] is True
    assert spec["pending_calls"]["outs"] == [{"reports/pending_calls": {"cache": False}}]
    assert set(spec["pending_calls"]["params"]) == {"run.systems", "run.sc_systems"}
    for stage in ("respond", "sc_continue"):
        body = spec[stage]["do"]
        assert "reports/pending_calls/${item}.json" in body["deps"], stage
        assert "run.max_failed_fraction" in body["params"], stage


def test_the_line_names_the_commonest_reasons_first():
    errors = pd.Series(["b"] * 3 + ["a"] * 3 + ["c"] * 5 + ["d\nsecond line"] + [None] * 2)
    assert over_limit("describe", 14, 20, errors) == (
        "describe: 14 of 20 calls failed: 5 x c, 3 x a, 3 x b, 3 x 2 other reasons"
    )


def test_pending_calls_is_cheap_and_writes_zeros_without_a_ledger(tmp_path):
    out = tmp_path / "pending"
    cache = tmp_path / "cache"
    pending_calls.update_ledger(cache, "b", {"describe": ["k2", "k1", "k2"], "summarize": []})
    (cache / "failed").mkdir(exist_ok=True)
    (cache / "failed" / "c.json").write_text("{not json")
    records = pending_calls.run_stage(systems=["a", "b", "c", "b"], cache_dir=cache, out_dir=out)
    assert sorted(p.name for p in out.iterdir()) == ["a.json", "b.json", "c.json"]
    assert json.loads((out / "a.json").read_text()) == {"failed_calls": 0, "round": 0, "system": "a"}
    assert records["b"] == {"failed_calls": 2, "round": 1, "system": "b"}
    assert (out / "b.json").read_text() == '{\n  "failed_calls": 2,\n  "round": 1,\n  "system": "b"\n}\n'
    assert records["c"]["round"] == 0  # an unreadable ledger counts as none; the system's next run rewrites it
    assert pending_calls.update_ledger(cache, "b", {"describe": ["k1"]})["round"] == 2
    assert pending_calls.update_ledger(cache, "b", {"describe": []}) is None
    assert not pending_calls.ledger_path(cache, "b").exists()
    # the stage imports neither pandas nor Great Expectations (it runs on every dvc repro)
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, stages.pending_calls, voicebias.pipeline.pending_calls; "
            "print(sorted(m for m in ('pandas', 'great_expectations') if m in sys.modules))",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert probe.stdout.strip() == "[]", probe.stderr


def test_the_respond_stage_records_the_determinism_probe_of_an_api_system(scratch):
    """With run.determinism_probe on, the stage re-sends that many answered requests of gpt_audio after
    the task and records the agreement in its tracked record; the fake API answers the same request
    with the same text and audio, so it reads 100 %. A second run reads the probe from the cache."""
    root = scratch
    with FakeOpenAIAudioServer(KEY) as server:
        stim, params = project(root, 12, {"base_url": server.base_url})
        params["run"]["determinism_probe"] = 5
        respond(params, root)
        first = sent(server)
        record = json.loads((root / "reports" / "respond" / "gpt_audio" / "describe.json").read_text())
        respond(params, root)
        assert len(sent(server)) == len(first)  # nothing sent again
    assert len(first) == 12 + 5 and len(set(first)) == 12  # 5 of the 12 inputs asked twice
    assert record["determinism"] == {
        "items": 5,
        "failed": 0,
        "text_agree": 5,
        "audio_agree": 5,
        "agree": 5,
        "agreement": 1.0,
    }
