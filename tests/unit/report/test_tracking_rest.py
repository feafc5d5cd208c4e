"""The tracked results read back through MLflow's REST API, as a dashboard or a notebook would.

`mlflow server` (tests/support/servers.py, bound to 127.0.0.1 on a free port) serves a temporary
store that log_pipeline_run fills from small hand-made analysis tables, a stimulus
manifest and a dvc.lock; runs/search, runs/get and experiments/get must return the
children's names, their metrics equal to the table values, the dataset inputs with their
DVC digests and the experiment's kind.
"""

from __future__ import annotations

import json
import math
import urllib.parse

import pandas as pd
import pytest

from tests.support.hand_made import SYSTEM, hand_made_store
from tests.support.servers import free_port, get_json, mlflow_server_cmd, post_json


def expected_metrics(analysis, lang, task):
    """The child's metrics as the tables give them (NaN left out)."""
    out = {} if lang == "ALL" else {"compliance/n": 12.0}  # the pooled children have no compliance row
    if task == "describe":
        o = pd.read_csv(analysis / "describe_odds_ratios.csv").set_index("lang").loc[lang]
        out.update(
            {
                "describe/odds_ratio": o["odds_ratio"],
                "describe/odds_ratio_ci_low": o["ci_low"],
                "describe/odds_ratio_ci_high": o["ci_high"],
                "describe/odds_ratio_p": o["p_value"],
                "describe/firth/odds_ratio": o["firth_odds_ratio"],
            }
        )
        rates = pd.read_csv(analysis / "describe_misgender.csv")
        for x in rates[rates["lang"] == lang].itertuples():
            out[f"describe/misgender_rate/{x.cell_type}"] = x.rate
    if task == "summarize":
        table = "summarize_pronouns.csv" if lang == "ALL" else "summarize_pronouns_by_lang.csv"
        p = pd.read_csv(analysis / table)
        p = p if lang == "ALL" else p[p["lang"] == lang]
        p = p.iloc[0]
        out.update({f"summarize/p_she/{pole}": p[f"p_she_{pole}"] for pole in ("masculine", "neutral", "feminine")})
        out.update({"summarize/delta_pp": p["delta_pp"], "summarize/injection_rate": p["injection_rate"]})
    if task != "describe" and lang != "ALL":
        rq1 = pd.read_csv(analysis / "rq1_mixed_models.csv")
        for r in rq1[(rq1["lang"] == lang) & (rq1["task"] == task)].to_dict("records"):
            for col in (
                "f_interaction",
                "p_interaction",
                "stereotype_effect_est",
                "stereotype_effect_ci_low",
                "stereotype_effect_ci_high",
                "stereotype_effect_p",
                "misaligned_minus_neutral_est",
                "misaligned_minus_neutral_ci_low",
                "misaligned_minus_neutral_ci_high",
                "misaligned_minus_neutral_p",
            ):
                out[f"rq1/{r['measure']}/{col}"] = r[col]
            out[f"rq1/{r['measure']}/converged"] = float(r["converged"])
    return {k: v for k, v in out.items() if not math.isnan(v)}


def test_rest_api_returns_each_childs_results_names_and_dataset_digests(tmp_path, server, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store, analysis, summary = hand_made_store(tmp_path)

    port = free_port()
    base = f"http://127.0.0.1:{port}/api/2.0/mlflow"
    server(
        mlflow_server_cmd(store, port, tmp_path / "mlruns" / "artifacts"),
        f"http://127.0.0.1:{port}/health",
        tmp_path,
        timeout=180,
    )
    exp = get_json(f"{base}/experiments/get?experiment_id={summary['experiment_id']}")["experiment"]
    assert {t["key"]: t["value"] for t in exp["tags"]}["mlflow.experimentKind"] == "custom_model_development"
    found = post_json(
        f"{base}/runs/search",
        {
            "experiment_ids": [summary["experiment_id"]],
            "max_results": 1000,
            "filter": f"tags.mlflow.parentRunId = '{summary['parent_run_id']}'",
        },
    )
    names = sorted(r["info"]["run_name"] for r in found["runs"])
    assert names == sorted(
        [f"{SYSTEM} / {lang} / {task}" for lang in ("en", "es") for task in ("describe", "summarize", "readback")]
        + [f"{SYSTEM} / ALL / describe", f"{SYSTEM} / ALL / summarize"]
    )
    # the tasks of one system share its respond stage's folder output, data/responses/<system>
    digests = {"describe": "0" * 32 + ".dir", "summarize": "0" * 32 + ".dir", "readback": "0" * 32 + ".dir"}
    for listed in found["runs"]:
        run_id = listed["info"]["run_id"]
        run = get_json(f"{base}/runs/get?{urllib.parse.urlencode({'run_id': run_id})}")["run"]
        tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
        metrics = {m["key"]: m["value"] for m in run["data"]["metrics"]}
        lang, task = tags["lang"], tags["task"]
        want = expected_metrics(analysis, lang, task)
        assert {k: metrics.get(k) for k in want} == pytest.approx(want, rel=1e-9), run["info"]["run_name"]
        assert all(math.isfinite(v) for v in metrics.values())
        (inp,) = run["inputs"]["dataset_inputs"]
        assert inp["dataset"]["name"] == f"responses/{SYSTEM}/{task}" and inp["dataset"]["digest"] == digests[task]
        assert json.loads(inp["dataset"]["source"]) == {"uri": f"data/responses/{SYSTEM}/{task}/responses.csv"}
        assert json.loads(inp["dataset"]["profile"])["dvc_out"] == f"data/responses/{SYSTEM}"
        if (lang, task) == ("es", "describe"):  # perfect separation: no odds ratio, the tag says which were left out
            assert tags["voicebias.skipped_metrics"] == (
                "describe/odds_ratio,describe/odds_ratio_ci_high,describe/odds_ratio_ci_low,describe/odds_ratio_p"
            )
            assert "describe/odds_ratio" not in metrics
        if task == "readback":
            listing = get_json(f"{base}/artifacts/list?{urllib.parse.urlencode({'run_id': run_id, 'path': 'tables'})}")
            assert [f["path"] for f in listing["files"]] == ["tables/rq1_mixed_models.csv"]
    parent = get_json(f"{base}/runs/get?run_id={summary['parent_run_id']}")["run"]
    inputs = {d["dataset"]["name"]: d for d in parent["inputs"]["dataset_inputs"]}
    assert {k: d["dataset"]["digest"] for k, d in inputs.items()} == {
        "stimuli": "5" * 32 + ".dir",
        **{f"responses/{SYSTEM}/{t}": d for t, d in digests.items()},
    }
    assert json.loads(inputs["stimuli"]["dataset"]["source"]) == {"uri": "data/stimuli/manifest.csv"}
    assert {t["key"]: t["value"] for t in inputs["stimuli"]["tags"]} == {"mlflow.data.context": "stimuli"}
