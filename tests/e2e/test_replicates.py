"""Whole-run replicates of an acoustically scored task on the reduced pipeline's own outputs: the
replies are measured as acoustic_scoring measures them, and a system whose readback does not depend on
the seed (voice_faithful reads the passage in its one output voice) moves no acoustic cell from one
run to the next."""

from __future__ import annotations

import shutil

import pandas as pd
import yaml

from voicebias.analysis.rq1 import ACOUSTIC_TASKS
from voicebias.io import read_table
from voicebias.params import validate_params
from voicebias.pipeline import replicates as stage

SYSTEM = "voice_faithful"


def test_replicated_readback_is_measured_and_a_seed_free_answer_has_no_spread(workspace, tmp_path, monkeypatch):
    import voicebias.runlog

    monkeypatch.setattr(voicebias.runlog, "RUN_LOG", tmp_path / "runs.jsonl")
    _, repo, _ = workspace
    raw = yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8"))
    raw["run"].update({"replicates": 2, "replicate_tasks": ["readback"]})
    params = validate_params(raw)
    assert "readback" in ACOUSTIC_TASKS
    # replies are written inside the project (their paths are kept relative to it); removed after the test
    data_dir = repo / "data" / "replicates-test"
    try:
        check(stage, params, repo, data_dir, tmp_path)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def check(stage, params, repo, data_dir, tmp_path):
    out = stage.run_stage(
        params,
        system=SYSTEM,
        manifest_path=repo / "data" / "stimuli" / "manifest.csv",
        passages_path=repo / "data" / "passages" / "passages.csv",
        gate_metrics=repo / "reports" / "carrier_gate" / "metrics.json",
        scored_path=repo / "data" / "scored" / f"{SYSTEM}.csv",
        acoustic_path=repo / "data" / "scored" / f"{SYSTEM}_acoustics.csv",
        inputs_path=repo / "data" / "measures" / "inputs.csv",
        reference_path=repo / "data" / "measures" / "composite_reference.csv",
        data_dir=data_dir,
        cache_dir=tmp_path / "responses",
        measure_cache=tmp_path / "measures",
        root=repo,
        out_dir=tmp_path / "reports",
        render_cache=tmp_path / "renders",
    )
    metrics = set(out["metric"])
    assert {"delta_composite", "delta_f0_median_st"} <= metrics and set(out["task"]) == {"readback"}
    assert (out["replicates"] == 2).all()
    # the replicate's replies were rendered and measured again (a new cache), and they are the run's
    replies = read_table(data_dir / "r1" / "readback" / "responses.csv")
    assert (replies["status"] == "ok").all() and len(replies) == len(
        read_table(repo / "data" / "responses" / SYSTEM / "readback" / "responses.csv")
    )
    cells = read_table(tmp_path / "reports" / "cells.csv")
    run0 = cells[cells["replicate"] == 0].drop(columns="replicate").reset_index(drop=True)
    run1 = cells[cells["replicate"] == 1].drop(columns="replicate").reset_index(drop=True)
    pd.testing.assert_frame_equal(run0, run1)
    assert (out["sd"] == 0).all() and (out["min"] == out["max"]).all()
