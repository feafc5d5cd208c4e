"""`voicebias preflight --estimate`: calls counted as the stages make them, input audio from the
passages, tokens from earlier replies of the system, priced with its card; nothing invented."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from voicebias.cli.estimate import estimate, format_estimate, plan
from voicebias.cli.profiles import resolve_profile
from voicebias.config import ROOT
from voicebias.cost import USAGE_COLUMNS
from voicebias.stimuli.bank import load_bank
from voicebias.tasks import load_tasks


@pytest.fixture
def workspace(tmp_path):
    """A workspace with the project's bank and cards and nothing run yet."""
    shutil.copytree(ROOT / "data" / "bank", tmp_path / "data" / "bank")
    shutil.copytree(ROOT / "models" / "cards", tmp_path / "models" / "cards")
    params = resolve_profile("embedded")
    params["run"]["systems"] = ["gpt_audio"]
    params["run"]["sc_systems"] = []
    params["continuum"]["passages_per_pole"] = 1
    return tmp_path, params


def test_calls_and_input_audio_are_counted_from_the_profile(workspace):
    root, params = workspace
    bank = load_bank(root / "data" / "bank", params["base"]["languages"])
    seconds = bank.set_index(["lang", "passage_id"])["length_units"] / params["tts"]["rate_wpm"] * 60
    table = plan(params, root).set_index(["part", "task"])
    tasks = load_tasks()
    for name in params["tasks"]["names"]:
        langs = tasks[name].languages() or params["base"]["languages"]
        mine = seconds[seconds.index.get_level_values("lang").isin(langs)]
        # each passage read once by a male and once by a female voice
        assert table.loc[("s2s", name), "calls"] == 2 * len(mine)
        assert table.loc[("s2s", name), "input_audio_s"] == pytest.approx(2 * mine.sum(), abs=0.1)
    # the continuum: 1 passage per pole x 2 poles x 1 language x 2 base voices x 7 steps
    for name in params["continuum"]["tasks"]:
        assert table.loc[("continuum", name), "calls"] == 1 * 2 * 1 * 2 * 7


def test_tokens_come_from_earlier_replies_and_are_priced_with_the_card(workspace):
    root, params = workspace
    # no reply here and no token rate in the card: the tokens and the cost stay unknown
    before = estimate(params, root)
    assert before["input_audio_tokens"].isna().all() and before["cost"].isna().all()
    assert "unknown" in format_estimate(before, "embedded")
    # earlier replies: 10 audio tokens per input second, 20 text tokens in, 5 text and 60 audio out per call
    calls = pd.DataFrame(
        [
            {
                "part": "s2s",
                "system": "gpt_audio",
                "task": "describe",
                "stimulus_id": f"x{i}",
                "sample": 0,
                "cache_key": f"k{i}",
                "status": "ok",
                "input_audio_s": s,
                "output_audio_s": 3.0,
                "input_tokens": 20 + 10 * s,
                "output_tokens": 65,
                "input_text_tokens": 20,
                "input_audio_tokens": 10 * s,
                "output_text_tokens": 5,
                "output_audio_tokens": 60,
                "input_cached_tokens": 0,
                "output_reasoning_tokens": 0,
                "cost": None,
            }
            for i, s in enumerate((20, 30, 40))
        ],
        columns=USAGE_COLUMNS,
    )
    (root / "reports" / "usage").mkdir(parents=True)
    calls.to_csv(root / "reports" / "usage" / "calls.csv", index=False)
    after = estimate(params, root).set_index(["part", "task"])
    row = after.loc[("s2s", "describe")]
    assert row["input_audio_tokens"] == round(10 * row["input_audio_s"])
    assert row["input_text_tokens"] == 20 * row["calls"] and row["output_audio_tokens"] == 60 * row["calls"]
    price = {"input_text": 2.5, "input_audio": 40.0, "output_text": 10.0, "output_audio": 80.0}  # the card's
    by_hand = sum(row[f"{k}_tokens"] * p / 1e6 for k, p in price.items())
    assert row["cost"] == pytest.approx(by_hand, abs=0.005) and row["currency"] == "USD"
    assert "measured on 3 earlier calls" in row["token_basis"]
    # a task without measured calls uses the rates over all tasks, and says so
    assert "all tasks" in after.loc[("s2s", "readback"), "token_basis"]
    text = format_estimate(after.reset_index(), "embedded")
    # 4 tasks x 180 + translate 120 + 2 x 28 continuum steps, and 2 more runs of describe (run.replicates 3)
    assert "gpt_audio: 1,256 calls" in text
    assert after.loc[("replicates", "describe"), "calls"] == 2 * 180
    assert "USD (prices of 2026-12-05)" in text
