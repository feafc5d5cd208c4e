"""`voicebias canary`: an earlier run's stored requests sent again to the model as configured now;
a model whose answers changed makes the exit status 1."""

from __future__ import annotations

import pytest

from tests.fakes.stimuli import make_stimuli
from tests.fakes.vllm_omni_server import FakeVLLMOmniServer, pinned_cards
from voicebias import cli
from voicebias.cli.canary import canary
from voicebias.io import write_table
from voicebias.systems.catalog import build_system
from voicebias.systems.runner import ResponseCache, RetryPolicy, run_task
from voicebias.tasks import load_tasks

QWEN = "Qwen/Qwen2.5-Omni-7B"
NAME = "qwen2_5_omni_vllm"


@pytest.fixture
def earlier_run(tmp_path):
    """A checkout of a run: its stimuli and the describe answers a seeded server gave."""
    (tmp_path / "cardsroot").mkdir()
    cards = pinned_cards(tmp_path / "cardsroot")
    stim = make_stimuli(tmp_path, 5)
    write_table(tmp_path / "data" / "stimuli" / "manifest.csv", stim)
    out = tmp_path / "data" / "responses" / NAME / "describe"
    with FakeVLLMOmniServer(QWEN) as server:
        sut = build_system(NAME, {"base_url": server.base_url, "timeout_s": 5.0}, cards_dir=cards, root=tmp_path)
        policy = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)
        table, _ = run_task(
            sut,
            load_tasks()["describe"],
            stim,
            out,
            ResponseCache(tmp_path / "cache"),
            3,
            tmp_path,
            policy=policy,
            progress=False,
        )
    write_table(out / "responses.csv", table)
    return tmp_path, cards


def params_for(server):
    return {
        "base": {"seed": 3},
        "tts": {"rate_wpm": 160},
        "run": {"systems": [NAME]},
        "systems": {NAME: {"base_url": server.base_url, "timeout_s": 5.0, "retry": {"max_attempts": 2}}},
    }


def test_the_same_model_passes_and_a_changed_one_is_named(earlier_run):
    run_dir, cards = earlier_run
    with FakeVLLMOmniServer(QWEN) as same:
        (r,) = canary(run_dir, params_for(same), [NAME], "describe", 4, cards_dir=cards)
        assert len(same.chats()) == 4  # sent past any cache
    assert r["items"] == 4 and r["same"] == 4 and not r["changed"] and r["key_changed"] == 0
    with FakeVLLMOmniServer(QWEN, ignore_seed=True) as changed:
        (r,) = canary(run_dir, params_for(changed), [NAME], "describe", 4, cards_dir=cards)
    assert r["same"] == 0 and len(r["changed"]) == 4
    assert all("text" in what and "audio differs" in what for _, what in r["changed"])


def test_the_command_exits_non_zero_when_the_answers_changed(earlier_run, monkeypatch, capsys):
    from voicebias import config

    run_dir, cards = earlier_run
    monkeypatch.setattr(config, "CARDS_DIR", cards)
    for ignore_seed, want in ((False, 0), (True, 1)):
        with FakeVLLMOmniServer(QWEN, ignore_seed=ignore_seed) as server:
            monkeypatch.setattr("voicebias.params.load_params", lambda: params_for(server))
            rc = cli.main(["canary", str(run_dir), "--items", "3"])
        out = capsys.readouterr().out
        assert rc == want, out
        assert ("CHANGED" in out) is bool(want) and f"{NAME}: {3 if not want else 0} of 3 describe answers" in out
