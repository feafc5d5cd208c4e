"""MLflow: one parent run per pipeline state and one child per system x language x task."""

import numpy as np
import pandas as pd
import pytest

from voicebias import config
from voicebias.params import load_params
from voicebias.pipeline.analysis import run_stage as run_analysis
from voicebias.io import read_table, write_json, write_table
from voicebias.systems.reference import planted_p_female
from voicebias.report.tracking import log_pipeline_run


def scored_table(system, params, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for lang in ("en", "es"):
        for pole in ("masculine", "neutral", "feminine"):
            for voice in ("male", "female"):
                for i in range(8):
                    judged = "female" if rng.random() < planted_p_female(params, pole, voice) else "male"
                    base = {"system": system, "lang": lang, "pole": pole, "voice_gender": voice,
                            "stimulus_id": f"{lang}-{pole}-{i}-{voice}", "status": "ok"}
                    rows.append({**base, "task": "describe", "judged_gender": judged, "pronoun_choice": None})
                    rows.append({**base, "task": "summarize", "judged_gender": None, "pronoun_choice": judged})
    return pd.DataFrame(rows)


@pytest.fixture
def pipeline_outputs(tmp_path):
    params = load_params(config.ROOT / "profiles" / "embedded.yaml")
    params["run"]["systems"] = ["content_driven", "voice_faithful"]
    paths = []
    for s in params["run"]["systems"]:
        p = tmp_path / "scored" / f"{s}.csv"
        write_table(p, scored_table(s, params["systems"][s], seed=len(s)))
        paths.append(p)
    run_analysis(params, paths, tmp_path / "analysis")
    gate = tmp_path / "gate"
    write_json(gate / "metrics.json", {"passed": True, "flips": 0})
    write_table(gate / "gate.csv", pd.DataFrame([{"lang": "en", "verdict": "pass"}]))
    manifest = tmp_path / "manifest.csv"
    write_table(manifest, pd.DataFrame({"stimulus_id": ["a", "b"], "sha256": ["1" * 64, "2" * 64]}))
    params["tracking"]["tracking_uri"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return params, tmp_path, manifest


def test_parent_and_children_carry_the_reported_numbers(pipeline_outputs, monkeypatch):
    from mlflow.tracking import MlflowClient

    params, tmp, manifest = pipeline_outputs
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    summary = log_pipeline_run(params, tmp / "analysis", tmp / "gate", manifest, tmp / "run.json", root=tmp)
    client = MlflowClient(params["tracking"]["tracking_uri"])
    parent = client.get_run(summary["parent_run_id"])
    assert parent.data.tags["voicebias.profile"] == "embedded"
    assert len(parent.data.tags["voicebias.stimulus_set"]) == 64
    runs = client.search_runs([summary["experiment_id"]], f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
                              max_results=1000)
    # 2 systems x 2 languages x 2 tasks, plus pooled describe and summarize per system
    assert len(runs) == 2 * 2 * 2 + 2 * 2
    odds = read_table(tmp / "analysis" / "describe_odds_ratios.csv")
    for r in runs:
        if r.data.tags["task"] == "describe" and r.data.tags["lang"] == "ALL":
            expected = odds[(odds["system"] == r.data.tags["system"]) & (odds["lang"] == "ALL")].iloc[0]
            assert r.data.metrics["odds_ratio"] == pytest.approx(expected["odds_ratio"], rel=1e-9)
            assert r.data.tags["voicebias.stimulus_set"] == parent.data.tags["voicebias.stimulus_set"]


def test_secrets_in_the_environment_never_reach_mlflow(pipeline_outputs, monkeypatch):
    params, tmp, manifest = pipeline_outputs
    secret = "sk-test-PLANTED-SECRET-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    log_pipeline_run(params, tmp / "analysis", tmp / "gate", manifest, tmp / "run.json", root=tmp)
    assert secret.encode() not in (tmp / "mlflow.db").read_bytes()
    assert secret not in (tmp / "last_run.json").read_text()
    assert secret not in (tmp / "run.json").read_text()


def test_same_pipeline_state_is_logged_once_and_the_marker_is_a_function_of_the_inputs(pipeline_outputs, monkeypatch):
    from mlflow.tracking import MlflowClient

    params, tmp, manifest = pipeline_outputs
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first = log_pipeline_run(params, tmp / "analysis", tmp / "gate", manifest, tmp / "state.json", root=tmp)
    marker = (tmp / "state.json").read_bytes()
    again = log_pipeline_run(params, tmp / "analysis", tmp / "gate", manifest, tmp / "state.json", root=tmp)
    assert again["parent_run_id"] == first["parent_run_id"] and again["reused"] and not first["reused"]
    assert (tmp / "state.json").read_bytes() == marker  # no run ids, no timestamps
    client = MlflowClient(params["tracking"]["tracking_uri"])
    parents = client.search_runs([first["experiment_id"]], "tags.`voicebias.level` = 'pipeline'")
    assert len(parents) == 1
    # changed evidence is a new state and a new parent; the old one stays
    gate = tmp / "gate" / "metrics.json"
    write_json(gate, {"passed": True, "flips": 1})
    changed = log_pipeline_run(params, tmp / "analysis", tmp / "gate", manifest, tmp / "state.json", root=tmp)
    assert changed["parent_run_id"] != first["parent_run_id"]
    assert (tmp / "state.json").read_bytes() != marker
    assert len(client.search_runs([first["experiment_id"]], "tags.`voicebias.level` = 'pipeline'")) == 2


def test_a_partly_logged_state_is_replaced_not_kept_beside_the_full_one(pipeline_outputs, monkeypatch):
    from mlflow.tracking import MlflowClient

    params, tmp, manifest = pipeline_outputs
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first = log_pipeline_run(params, tmp / "analysis", tmp / "gate", manifest, tmp / "state.json", root=tmp)
    client = MlflowClient(params["tracking"]["tracking_uri"])
    victim = client.search_runs([first["experiment_id"]], f"tags.mlflow.parentRunId = '{first['parent_run_id']}'")[0]
    client.delete_run(victim.info.run_id)  # as if the logging had been killed before this child
    again = log_pipeline_run(params, tmp / "analysis", tmp / "gate", manifest, tmp / "state.json", root=tmp)
    assert not again["reused"] and again["parent_run_id"] != first["parent_run_id"]
    parents = client.search_runs([first["experiment_id"]], "tags.`voicebias.level` = 'pipeline'")
    assert [p.info.run_id for p in parents] == [again["parent_run_id"]]
    kids = client.search_runs([first["experiment_id"]], f"tags.mlflow.parentRunId = '{again['parent_run_id']}'")
    assert len(kids) == len(first["children"])
