"""MLflow: one parent run per pipeline state and one child per system x language x task."""

import hashlib
import json

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.support.tracking import rq1_rows
from voicebias import config
from voicebias.io import read_table, write_json, write_table
from voicebias.params import load_params
from voicebias.pipeline.analysis import run_stage as run_analysis
from voicebias.pipeline.respond import planted_truth
from voicebias.report.tracking import log_pipeline_run
from voicebias.systems.reference import planted_p_female


def scored_table(system, params, seed):
    rng = np.random.default_rng(seed)
    rows = []
    for lang in ("en", "es"):
        for pole in ("masculine", "neutral", "feminine"):
            for voice in ("male", "female"):
                for i in range(8):
                    judged = "female" if rng.random() < planted_p_female(params, pole, voice) else "male"
                    base = {
                        "system": system,
                        "lang": lang,
                        "pole": pole,
                        "voice_gender": voice,
                        "stimulus_id": f"{lang}-{pole}-{i}-{voice}",
                        "status": "ok",
                    }
                    rows.append({**base, "task": "describe", "judged_gender": judged, "pronoun_choice": None})
                    rows.append({**base, "task": "summarize", "judged_gender": None, "pronoun_choice": judged})
    return pd.DataFrame(rows)


def add_rq1_children(analysis, systems):
    """readback children (compliance rows) with their RQ1 fits; the last fit has no p (NaN)."""
    comp = read_table(analysis / "compliance.csv")
    extra, rows = [], []
    for k, (system, lang) in enumerate((s, lang) for s in systems for lang in ("en", "es")):
        extra.append({"system": system, "lang": lang, "task": "readback", "n": 48, "failed": 0, "non_compliant": 1})
        rows += rq1_rows(system, lang, "readback", k)
    rows[-1]["p_interaction"] = float("nan")
    write_table(analysis / "compliance.csv", pd.concat([comp, pd.DataFrame(extra)], ignore_index=True))
    write_table(analysis / "rq1_mixed_models.csv", pd.DataFrame(rows))


@pytest.fixture
def pipeline_outputs(tmp_path):
    params = load_params(config.ROOT / "profiles" / "embedded.yaml")
    params["run"]["systems"] = ["content_driven", "voice_faithful"]
    paths, truths = [], {}
    for s in params["run"]["systems"]:
        p = tmp_path / "scored" / f"{s}.csv"
        write_table(p, scored_table(s, params["systems"][s], seed=len(s)))
        paths.append(p)
        truths[s] = tmp_path / "respond" / s / "planted_truth.json"  # what the respond stage records
        write_json(truths[s], planted_truth(s, params["systems"][s]))
    run_analysis(params, scored_paths=paths, out_dir=tmp_path / "analysis", planted_truth_paths=truths)
    add_rq1_children(tmp_path / "analysis", params["run"]["systems"])
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
    runs = client.search_runs(
        [summary["experiment_id"]], f"tags.mlflow.parentRunId = '{parent.info.run_id}'", max_results=1000
    )
    # 2 systems x 2 languages x 3 tasks, plus pooled describe and summarize per system
    assert len(runs) == 2 * 2 * 3 + 2 * 2
    analysis = tmp / "analysis"
    odds = read_table(analysis / "describe_odds_ratios.csv")
    rates = read_table(analysis / "describe_misgender.csv")
    pron = read_table(analysis / "summarize_pronouns.csv")
    pron_lang = read_table(analysis / "summarize_pronouns_by_lang.csv")
    rq1 = read_table(analysis / "rq1_mixed_models.csv")
    checked = {"describe": 0, "summarize": 0, "readback": 0}
    for r in runs:
        tags, metrics = r.data.tags, r.data.metrics
        system, lang, task = tags["system"], tags["lang"], tags["task"]
        assert r.info.run_name == f"{system} / {lang} / {task}"
        assert tags["voicebias.stimulus_set"] == parent.data.tags["voicebias.stimulus_set"]
        if task == "describe":
            o = odds[(odds["system"] == system) & (odds["lang"] == lang)].iloc[0]
            for metric, col in (
                ("odds_ratio", "odds_ratio"),
                ("odds_ratio_ci_low", "ci_low"),
                ("odds_ratio_ci_high", "ci_high"),
                ("odds_ratio_p", "p_value"),
            ):
                if pd.notna(o[col]):
                    assert metrics[f"describe/{metric}"] == pytest.approx(o[col], rel=1e-9)
            for x in rates[(rates["system"] == system) & (rates["lang"] == lang)].itertuples():
                assert metrics[f"describe/misgender_rate/{x.cell_type}"] == pytest.approx(x.rate, rel=1e-9)
            assert tags["fit_status"] == o["fit_status"]
        elif task == "summarize":
            table = pron if lang == "ALL" else pron_lang[pron_lang["lang"] == lang]
            p = table[table["system"] == system].iloc[0]
            for pole in ("masculine", "neutral", "feminine"):
                assert metrics[f"summarize/p_she/{pole}"] == pytest.approx(p[f"p_she_{pole}"], rel=1e-9)
            assert metrics["summarize/delta_pp"] == pytest.approx(p["delta_pp"], rel=1e-9)
            assert metrics["summarize/injection_rate"] == pytest.approx(p["injection_rate"], rel=1e-9)
        else:
            fit = rq1[(rq1["system"] == system) & (rq1["lang"] == lang) & (rq1["task"] == task)]
            for row in fit.to_dict("records"):
                for col in (
                    "f_interaction",
                    "stereotype_effect_est",
                    "stereotype_effect_ci_low",
                    "stereotype_effect_ci_high",
                    "stereotype_effect_p",
                    "misaligned_minus_neutral_est",
                    "misaligned_minus_neutral_ci_low",
                    "misaligned_minus_neutral_ci_high",
                    "misaligned_minus_neutral_p",
                ):
                    assert metrics[f"rq1/{row['measure']}/{col}"] == pytest.approx(row[col], rel=1e-9)
                assert metrics[f"rq1/{row['measure']}/converged"] == float(row["converged"])
            # the fit rows travel with the child as a table
            local = client.download_artifacts(r.info.run_id, "tables/rq1_mixed_models.csv", str(tmp))
            pd.testing.assert_frame_equal(read_table(local).reset_index(drop=True), fit.reset_index(drop=True))
        checked[task] += 1
    assert checked == {"describe": 6, "summarize": 6, "readback": 4}


def test_nan_results_are_left_out_and_named_in_a_tag(pipeline_outputs, monkeypatch):
    from mlflow.tracking import MlflowClient

    params, tmp, manifest = pipeline_outputs
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    odds_path = tmp / "analysis" / "describe_odds_ratios.csv"
    odds = read_table(odds_path)
    row = (odds["system"] == "voice_faithful") & (odds["lang"] == "en")
    odds.loc[row, ["odds_ratio", "ci_low", "ci_high", "p_value"]] = np.nan
    odds.loc[row, "fit_status"] = "perfect separation (complete)"
    odds.loc[row, "firth_ci_high"] = np.inf
    write_table(odds_path, odds)
    summary = log_pipeline_run(params, tmp / "analysis", tmp / "gate", manifest, tmp / "run.json", root=tmp)
    client = MlflowClient(params["tracking"]["tracking_uri"])
    kids = {
        k.info.run_name: k
        for k in client.search_runs(
            [summary["experiment_id"]], f"tags.mlflow.parentRunId = '{summary['parent_run_id']}'"
        )
    }
    sep = kids["voice_faithful / en / describe"]
    assert "describe/odds_ratio" not in sep.data.metrics and "describe/firth/odds_ratio_ci_high" not in sep.data.metrics
    assert sep.data.tags["voicebias.skipped_metrics"].split(",") == [
        "describe/firth/odds_ratio_ci_high",
        "describe/odds_ratio",
        "describe/odds_ratio_ci_high",
        "describe/odds_ratio_ci_low",
        "describe/odds_ratio_p",
    ]
    assert sep.data.metrics["describe/firth/odds_ratio"] > 0 and sep.data.tags["fit_status"].startswith("perfect")
    # the hand-made fit with no interaction p (add_rq1_children) is named, its other numbers logged
    last = kids["voice_faithful / es / readback"]
    assert last.data.tags["voicebias.skipped_metrics"] == "rq1/net_f0_median_st/p_interaction"
    assert "rq1/net_f0_median_st/p_interaction" not in last.data.metrics
    assert last.data.metrics["rq1/net_f0_median_st/converged"] == 0.0
    assert last.data.tags["rq1/net_f0_median_st/warning"] == "singular fit"
    assert "voicebias.skipped_metrics" not in kids["content_driven / en / readback"].data.tags


def test_dataset_inputs_carry_the_dvc_hashes_and_the_report_is_on_the_parent(pipeline_outputs, monkeypatch):
    from mlflow.tracking import MlflowClient

    params, tmp, _ = pipeline_outputs
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    manifest = tmp / "data" / "stimuli" / "manifest.csv"
    write_table(manifest, pd.DataFrame({"stimulus_id": ["a", "b"], "sha256": ["1" * 64, "2" * 64]}))
    # content_driven's responses have dvc.lock entries; voice_faithful's readback table has none but exists
    outs = {"stimuli": [{"path": "data/stimuli", "hash": "md5", "md5": "a" * 32 + ".dir"}]}
    outs["respond@content_driven"] = [
        {"path": "data/responses/content_driven", "hash": "md5", "md5": "c" * 32 + ".dir"},
        {"path": "reports/respond/content_driven", "hash": "md5", "md5": "f" * 32 + ".dir"},
    ]
    (tmp / "dvc.lock").write_text(
        yaml.safe_dump(
            {"schema": "2.0", "stages": {name: {"cmd": "python -m stages.x", "outs": o} for name, o in outs.items()}}
        )
    )
    vf = tmp / "data" / "responses" / "voice_faithful" / "readback" / "responses.csv"
    write_table(vf, pd.DataFrame({"stimulus_id": ["a"], "text": ["hello"]}))
    report = tmp / "report"
    (report / "figures").mkdir(parents=True)
    for f in ("audit_card.md", "audit_card.json", "report.html"):
        (report / f).write_text(f"{f}\n")
    (report / "figures" / "odds_ratio_forest.png").write_bytes(b"png")
    summary = log_pipeline_run(
        params, tmp / "analysis", tmp / "gate", manifest, tmp / "run.json", root=tmp, report_dir=report
    )
    client = MlflowClient(params["tracking"]["tracking_uri"])
    parent = client.get_run(summary["parent_run_id"])
    got = {d.dataset.name: d for d in parent.inputs.dataset_inputs}
    vf_sha = hashlib.sha256(vf.read_bytes()).hexdigest()
    assert {k: d.dataset.digest for k, d in got.items()} == {
        "stimuli": "a" * 32 + ".dir",
        "responses/content_driven/describe": "c" * 32 + ".dir",
        "responses/content_driven/summarize": "c" * 32 + ".dir",
        "responses/content_driven/readback": "c" * 32 + ".dir",
        "responses/voice_faithful/readback": f"sha256:{vf_sha[:29]}",
    }  # the tables without either are left out
    assert json.loads(got["stimuli"].dataset.source) == {"uri": "data/stimuli/manifest.csv"}
    assert json.loads(got["stimuli"].dataset.profile)["dvc_out"] == "data/stimuli"
    assert json.loads(got["stimuli"].dataset.profile)["sha256"] == hashlib.sha256(manifest.read_bytes()).hexdigest()
    assert (
        json.loads(got["responses/content_driven/readback"].dataset.profile)["dvc_out"]
        == "data/responses/content_driven"
    )
    assert json.loads(got["responses/voice_faithful/readback"].dataset.profile)["sha256"] == vf_sha
    assert {t.key: t.value for t in got["stimuli"].tags} == {"mlflow.data.context": "stimuli"}
    kids = {
        k.info.run_name: k
        for k in client.search_runs(
            [summary["experiment_id"]], f"tags.mlflow.parentRunId = '{summary['parent_run_id']}'"
        )
    }
    for name in ("content_driven / en / readback", "content_driven / ALL / describe"):
        (d,) = client.get_run(kids[name].info.run_id).inputs.dataset_inputs
        assert d.dataset.name == "responses/content_driven/" + name.split(" / ")[-1]
    assert client.get_run(kids["voice_faithful / en / describe"].info.run_id).inputs.dataset_inputs == []
    arts = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert arts == {"report/audit_card.md", "report/audit_card.json", "report/report.html", "report/figures"}
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "report/figures")] == [
        "report/figures/odds_ratio_forest.png"
    ]
    # the report is part of the pipeline state: a changed card is another parent
    (report / "audit_card.md").write_text("changed\n")
    again = log_pipeline_run(
        params, tmp / "analysis", tmp / "gate", manifest, tmp / "run.json", root=tmp, report_dir=report
    )
    assert again["pipeline_state"] != summary["pipeline_state"]


def test_the_disaggregated_table_is_on_the_parent_and_each_child_has_its_rows(pipeline_outputs, monkeypatch):
    from mlflow.artifacts import download_artifacts
    from mlflow.tracking import MlflowClient

    from voicebias.analysis.disaggregated import disaggregate, s2s_items

    params, tmp, manifest = pipeline_outputs
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    scored = pd.concat([read_table(p) for p in sorted((tmp / "scored").glob("*.csv"))], ignore_index=True)
    dis_path = tmp / "disaggregated" / "disaggregated.csv"
    write_table(dis_path, disaggregate(s2s_items(scored, None), resamples=200, seed=1))
    summary = log_pipeline_run(
        params, tmp / "analysis", tmp / "gate", manifest, tmp / "run.json", root=tmp, disaggregated=dis_path
    )
    uri = params["tracking"]["tracking_uri"]
    client = MlflowClient(uri)
    assert [a.path for a in client.list_artifacts(summary["parent_run_id"], "tables")] == ["tables/disaggregated.csv"]
    kids = {
        k.info.run_name: k.info.run_id
        for k in client.search_runs(
            [summary["experiment_id"]], f"tags.mlflow.parentRunId = '{summary['parent_run_id']}'"
        )
    }
    own = pd.read_csv(
        download_artifacts(
            run_id=kids["content_driven / es / describe"],
            artifact_path="tables/disaggregated.csv",
            tracking_uri=uri,
            dst_path=str(tmp / "dl"),
        )
    )
    full = read_table(dis_path)
    want = full[(full["system"] == "content_driven") & (full["lang"] == "es") & (full["task"] == "describe")]
    assert len(own) == len(want) == 9  # 6 voice x pole cells and 3 cell types of the misgender rate
    assert set(own["metric"]) == {"misgender_rate"}
    np.testing.assert_allclose(own["estimate"], want["estimate"])
    # the table is part of the pipeline state
    write_table(dis_path, full.assign(ci_low=full["ci_low"] - 0.01))
    again = log_pipeline_run(
        params, tmp / "analysis", tmp / "gate", manifest, tmp / "run.json", root=tmp, disaggregated=dis_path
    )
    assert again["pipeline_state"] != summary["pipeline_state"]


def test_a_parent_whose_children_have_other_names_is_replaced(pipeline_outputs, monkeypatch):
    from mlflow.tracking import MlflowClient

    params, tmp, manifest = pipeline_outputs
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    first = log_pipeline_run(params, tmp / "analysis", tmp / "gate", manifest, tmp / "state.json", root=tmp)
    client = MlflowClient(params["tracking"]["tracking_uri"])
    kid = client.search_runs([first["experiment_id"]], f"tags.mlflow.parentRunId = '{first['parent_run_id']}'")[0]
    client.set_tag(kid.info.run_id, "mlflow.runName", kid.info.run_name.replace(" / ", "/"))  # an older naming
    again = log_pipeline_run(params, tmp / "analysis", tmp / "gate", manifest, tmp / "state.json", root=tmp)
    assert not again["reused"] and again["pipeline_state"] == first["pipeline_state"]
    parents = client.search_runs([first["experiment_id"]], "tags.`voicebias.level` = 'pipeline'")
    assert [p.info.run_id for p in parents] == [again["parent_run_id"]]
    names = [c["name"] for c in again["children"]]
    assert names == json.loads((tmp / "state.json").read_text())["children"] and all(" / " in n for n in names)


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


def test_dvc_outs_reads_the_lock_as_the_pure_python_parser_does(tmp_path):
    from voicebias.report.tracking import dvc_outs

    text = (config.ROOT / "dvc.lock").read_text(encoding="utf-8")
    lock = yaml.safe_load(text)
    expected = {
        str(o["path"]).rstrip("/"): str(o["md5"])
        for s in lock["stages"].values()
        for o in s.get("outs") or []
        if o.get("md5")
    }
    assert len(expected) > 20 and dvc_outs(config.ROOT / "dvc.lock") == expected
    odd = tmp_path / "dvc.lock"
    odd.write_text(
        "schema: '2.0'\nstages:\n  a:\n    outs:\n    - path: data/x/\n      md5: 0123.dir\n"
        "    - path: y.csv\n      hash: md5\n",
        encoding="utf-8",
    )
    assert dvc_outs(odd) == {"data/x": "0123.dir"} and dvc_outs(tmp_path / "none.lock") == {}


def test_describe_and_summarize_children_carry_their_voice_continuum_fit(pipeline_outputs):
    from tests.support.continuum_design import CONTINUUM, continuum_answers
    from voicebias.analysis.psychometric import psychometric_table
    from voicebias.report.tracking import child_records

    _, tmp, _ = pipeline_outputs
    answers = pd.concat(
        [
            continuum_answers(k, shift=-2.0, passages=12).assign(system=s, task=t)
            for k, (s, t) in enumerate([("voice_faithful", "describe"), ("voice_faithful", "summarize")])
        ],
        ignore_index=True,
    )
    table = psychometric_table(answers, CONTINUUM)
    write_table(tmp / "psychometric.csv", table)
    table = read_table(tmp / "psychometric.csv")  # as the stage wrote it (10 significant digits)
    records = {
        (r["system"], r["lang"], r["task"]): r for r in child_records(tmp / "analysis", tmp / "psychometric.csv")
    }
    for task in ("describe", "summarize"):
        m = records[("voice_faithful", "ALL", task)]["metrics"]
        rows = table[(table["task"] == task) & (table["lang"] == "ALL")].set_index("quantity")
        assert m["psychometric/slope_per_st"] == rows.loc["slope", "estimate"]
        assert m["psychometric/shift_st"] == rows.loc["shift", "estimate"]
        assert m["psychometric/shift_ci_high"] == rows.loc["shift", "ci_high"] < 0
        assert m["psychometric/follows_voice"] == 1.0
        assert m["psychometric/pse_st/feminine"] == rows.loc["pse"].set_index("pole").loc["feminine", "estimate"]
    assert not any(k.startswith("psychometric/") for k in records[("content_driven", "ALL", "describe")]["metrics"])
    # without the table the children are as before
    assert not any(k.startswith("psychometric/") for r in child_records(tmp / "analysis") for k in r["metrics"])


def test_usage_metrics_are_the_system_x_tasks_totals_and_skip_what_was_not_reported():
    from voicebias.report.tracking import usage_metrics

    usage = pd.DataFrame(
        [
            {"system": "api", "part": "s2s", "task": "describe", "calls": 180, "input_audio_s": 4812.5, "cost": 1.25},
            {"system": "api", "part": "continuum", "task": "describe", "calls": 112, "input_audio_s": 2443.0},
            {"system": "api", "part": "ALL", "task": "ALL", "calls": 292, "input_audio_s": 7255.5, "cost": 2.0},
            {"system": "local", "part": "s2s", "task": "describe", "calls": 180, "input_audio_s": 4812.5},
        ]
    )
    assert usage_metrics(usage, "api", "describe") == {
        "usage/calls": 180.0,
        "usage/input_audio_s": 4812.5,
        "usage/cost": 1.25,
    }
    assert usage_metrics(usage, "api", "ALL")["usage/calls"] == 292.0
    assert "usage/cost" not in usage_metrics(usage, "local", "describe")  # no price table: no cost metric
    assert usage_metrics(usage, "local", "summarize") == {}


def test_probed_children_carry_their_agreement_and_the_parent_each_systems_usage(pipeline_outputs, monkeypatch):
    from mlflow.tracking import MlflowClient

    params, tmp, manifest = pipeline_outputs
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    system = params["run"]["systems"][0]
    probe = {"items": 8, "failed": 0, "text_agree": 8, "audio_agree": 5, "agree": 5, "agreement": 0.625}
    usage = tmp / "usage.csv"
    write_table(
        usage,
        pd.DataFrame(
            [
                {"system": system, "part": "s2s", "task": "describe", "calls": 180, "cost": 0.42},
                {"system": system, "part": "ALL", "task": "ALL", "calls": 900, "cost": 2.5},
            ]
        ),
    )
    summary = log_pipeline_run(
        params,
        tmp / "analysis",
        tmp / "gate",
        manifest,
        tmp / "run.json",
        root=tmp,
        usage=usage,
        determinism={system: {"describe": probe}},
    )
    client = MlflowClient(params["tracking"]["tracking_uri"])
    parent = client.get_run(summary["parent_run_id"])
    assert parent.data.metrics[f"usage/{system}/calls"] == 900 and parent.data.metrics[f"usage/{system}/cost"] == 2.5
    runs = client.search_runs(
        [summary["experiment_id"]], f"tags.mlflow.parentRunId = '{parent.info.run_id}'", max_results=1000
    )
    pooled = [r for r in runs if r.data.tags["system"] == system and r.data.tags["lang"] == "ALL"]
    describe = [r for r in pooled if r.data.tags["task"] == "describe"][0]
    assert describe.data.metrics["determinism/agreement"] == 0.625 and describe.data.metrics["determinism/items"] == 8
    assert describe.data.metrics["usage/calls"] == 180 and describe.data.metrics["usage/cost"] == 0.42
    assert all("determinism/agreement" not in r.data.metrics for r in runs if r.data.tags["lang"] != "ALL")


@pytest.mark.parametrize("user, expected", [(None, "true"), ("false", "false")])
def test_mlflow_telemetry_is_off_unless_the_user_allows_it(user, expected):
    """MLflow 3 reports usage to its maintainers by default. A process that imports voicebias's
    tracking (the tracking stage, `voicebias compare`, `voicebias ui`) turns it off before MLflow
    loads, and MLflow reads it as off; a user's own MLFLOW_DISABLE_TELEMETRY=false stands."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK")}
    if user is not None:
        env["MLFLOW_DISABLE_TELEMETRY"] = user
    code = (
        "import os, voicebias.report.tracking\n"
        "from mlflow.environment_variables import MLFLOW_DISABLE_TELEMETRY\n"
        "print(os.environ['MLFLOW_DISABLE_TELEMETRY'], MLFLOW_DISABLE_TELEMETRY.get())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=config.ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [expected, str(expected == "true")]
