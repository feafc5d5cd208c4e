"""Stage 'usage': every response table of the run, per call and in totals, priced with the cards."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from voicebias.config import CARDS_DIR
from voicebias.io import read_json, read_table
from voicebias.pipeline.usage import run_stage


def _table(system: str, task: str, ids: list[str], usage: dict | None) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "system": system,
            "task": task,
            "stimulus_id": ids,
            "cache_key": [f"{system}-{task}-{i}" for i in ids],
            "status": "ok",
            "attempts": 1,
            "output_duration_s": 2.0,
            "provenance": json.dumps({"usage": usage} if usage else {}),
        }
    )


def test_the_stage_sums_every_part_per_task_and_per_system(tmp_path):
    cards = tmp_path / "cards"
    shutil.copytree(CARDS_DIR, cards)
    usage = {
        "prompt_tokens": 110,
        "completion_tokens": 50,
        "prompt_tokens_details": {"audio_tokens": 100, "text_tokens": 10},
        "completion_tokens_details": {"audio_tokens": 40, "text_tokens": 10},
    }
    tables = {
        ("gpt_audio", "describe"): _table("gpt_audio", "describe", ["a", "b"], usage),
        ("gpt_audio", "continuum/describe"): _table("gpt_audio", "describe", ["a-s0", "a-s1", "a-s2"], usage),
        ("voice_faithful", "describe"): _table("voice_faithful", "describe", ["a", "b"], None),
    }
    for (system, task), t in tables.items():
        path = tmp_path / "responses" / system / task / "responses.csv"
        path.parent.mkdir(parents=True)
        t.to_csv(path, index=False)
    manifest = tmp_path / "manifest.csv"
    pd.DataFrame({"stimulus_id": ["a", "b", "a-s0", "a-s1", "a-s2"], "duration_s": [10.0, 20.0, 1.0, 2.0, 3.0]}).to_csv(
        manifest, index=False
    )
    params = {
        "run": {"systems": ["gpt_audio", "voice_faithful"], "sc_systems": []},
        "tasks": {"names": ["describe", "summarize"]},  # summarize has no table: skipped
        "continuum": {"enabled": True, "tasks": ["describe"]},
    }
    out = tmp_path / "usage"
    run_stage(
        params,
        responses_dir_for=lambda s, t: tmp_path / "responses" / s / t,
        continuum_responses_dir_for=lambda s, t: tmp_path / "responses" / s / f"continuum/{t}",
        continuations_for=lambda s: tmp_path / "none.csv",
        manifests=[manifest, tmp_path / "absent.csv"],
        cards_dir=cards,
        out_dir=out,
    )
    calls = read_table(out / "calls.csv")
    assert len(calls) == 7 and set(calls["part"]) == {"s2s", "continuum"}
    totals = read_table(out / "usage.csv").set_index(["system", "part", "task"])
    api = totals.loc[("gpt_audio", "ALL", "ALL")]
    assert api["calls"] == 5 and api["input_audio_s"] == 36.0 and api["output_audio_s"] == 10.0
    assert api["input_audio_tokens"] == 500 and api["output_text_tokens"] == 50
    assert api["cost"] == pytest.approx(5 * (10 * 2.5 + 100 * 40 + 10 * 10 + 40 * 80) / 1e6)
    assert totals.loc[("gpt_audio", "continuum", "describe"), "calls"] == 3
    ref = totals.loc[("voice_faithful", "ALL", "ALL")]
    assert ref["calls"] == 2 and ref["calls_with_usage"] == 0 and pd.isna(ref["cost"])
    metrics = read_json(out / "metrics.json")
    assert metrics["gpt_audio"]["price_date"] == "2026-12-05" and metrics["voice_faithful"]["cost"] is None
