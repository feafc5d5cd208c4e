"""MLflow tracking: one parent run per pipeline state, one child run per system x language x task.

The store (`mlruns/mlflow.db`, artifacts in `mlruns/artifacts/`) is an output of the
tracking stage: DVC sees it through the state marker `mlruns/pipeline_state.json`, so a
fresh clone, which has no store, runs the tracking stage and ends with the runs in it.
A pipeline state (the tracking inputs' bytes and params) is logged once: tracking the
same state again reuses the finished parent and deletes partial leftovers.

Children are created with an explicit parent id (the active-run stack is
thread-local), and carry the same family tags as the parent so the MLflow UI can
filter and compare them across pipeline runs. Only parameters, metrics and tags
from params.yaml and reports/ are logged: never the environment.
"""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.config import ROOT


def tracking_uri(params: dict[str, Any], root: Path = ROOT) -> str:
    """Resolve a relative sqlite URI against the repository root."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or params["tracking"]["tracking_uri"]
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix):].startswith("/"):
        return prefix + str((root / uri[len(prefix):]).resolve())
    return uri


def git_commit(root: Path = ROOT) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def stimulus_set_hash(manifest: pd.DataFrame) -> str:
    """sha256 over the sorted (stimulus_id, audio sha256) pairs: names the exact stimulus set."""
    pairs = sorted(zip(manifest["stimulus_id"], manifest["sha256"]))
    return hashlib.sha256("\n".join(f"{a} {b}" for a, b in pairs).encode()).hexdigest()


def file_hash(path: Path) -> str:
    if not path.exists():
        return "absent"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _metrics(d: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in d.items():
        if v is None or isinstance(v, str):
            continue
        v = float(v)
        if math.isfinite(v):
            out[k] = v
    return out


def child_records(analysis_dir: Path) -> list[dict[str, Any]]:
    """One record (tags, params, metrics) per system x language x task from the analysis tables."""
    from voicebias.io import read_table

    comp = read_table(analysis_dir / "compliance.csv")
    odds = read_table(analysis_dir / "describe_odds_ratios.csv")
    rates = read_table(analysis_dir / "describe_misgender.csv")
    pron = read_table(analysis_dir / "summarize_pronouns.csv")
    records = []
    for r in comp.itertuples():
        m = {"n": r.n, "failed": r.failed, "non_compliant": r.non_compliant}
        tags: dict[str, str] = {}
        if r.task == "describe":
            rr = rates[(rates["system"] == r.system) & (rates["lang"] == r.lang)]
            for x in rr.itertuples():
                m[f"misgender_rate_{x.cell_type}"] = x.rate
            o = odds[(odds["system"] == r.system) & (odds["lang"] == r.lang)]
            if len(o):
                o = o.iloc[0]
                m.update(odds_ratio=o["odds_ratio"], or_ci_low=o["ci_low"], or_ci_high=o["ci_high"], or_p=o["p_value"])
                tags["fit_status"] = str(o["fit_status"])
        records.append({"system": r.system, "lang": r.lang, "task": r.task, "metrics": _metrics(m), "tags": tags})
    # pooled (ALL languages) describe and summarize
    for o in odds[odds["lang"] == "ALL"].itertuples():
        m = {"odds_ratio": o.odds_ratio, "or_ci_low": o.ci_low, "or_ci_high": o.ci_high, "or_p": o.p_value, "n": o.n,
             "n_excluded": o.n_excluded}
        for x in rates[(rates["system"] == o.system) & (rates["lang"] == "ALL")].itertuples():
            m[f"misgender_rate_{x.cell_type}"] = x.rate
        records.append({"system": o.system, "lang": "ALL", "task": "describe", "metrics": _metrics(m),
                        "tags": {"fit_status": str(o.fit_status)}})
    for p in pron.itertuples():
        records.append({"system": p.system, "lang": "ALL", "task": "summarize", "tags": {}, "metrics": _metrics({
            "delta_pp": p.delta_pp, "injection_rate": p.injection_rate, "delta_pp_male_voice": p.delta_pp_male_voice,
            "delta_pp_female_voice": p.delta_pp_female_voice})})
    return records


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        elif isinstance(v, bool):
            out[f"{prefix}{k}"] = float(v)
        else:
            out[f"{prefix}{k}"] = v
    return out


def sc_child_records(params: dict[str, Any], sc_dir: Path, phonation_dir: Path) -> list[dict[str, Any]]:
    """Records of the speech-continuation study: the phonation manipulation check and one
    run per continuation system (task 'continue'), with their tables as artifacts."""
    from voicebias.io import read_json, read_table

    records: list[dict[str, Any]] = []
    check = phonation_dir / "check_metrics.json"
    if check.exists():
        backend = str(params["phonation"]["backend"])
        records.append({"system": f"phonation:{backend}", "lang": "en", "task": "phonation_check",
                        "metrics": _metrics(_flat(read_json(check))), "tags": {"voicebias.study": "sc"},
                        "artifacts": [phonation_dir / "manipulation_check.csv"]})
    if not (sc_dir / "success.csv").exists():
        return records
    success = read_table(sc_dir / "success.csv")
    ret = read_table(sc_dir / "retention.csv")
    sim = read_table(sc_dir / "speaker_similarity.csv")
    scores = read_table(sc_dir / "judge_scores.csv")
    for r in success.itertuples():
        m: dict[str, Any] = {"n": r.n, "succeeded": r.succeeded, "success_rate": r.success_rate,
                             "all_systems_succeeded": r.all_systems_succeeded}
        for x in ret[ret["system"] == r.system].itertuples():
            m[f"retention_{x.measure}_{x.voice_gender}"] = x.retention
        for x in sim[sim["system"] == r.system].itertuples():
            m[f"speaker_similarity_{x.phonation}_{x.voice_gender}"] = x.mean
        for x in scores[(scores["system"] == r.system) & (scores["phonation"] == "all")].itertuples():
            m[f"judge_{x.dimension}_{x.voice_gender}"] = x.mean
        records.append({"system": r.system, "lang": "en", "task": "continue", "metrics": _metrics(m),
                        "tags": {"voicebias.study": "sc"},
                        "artifacts": [sc_dir / f for f in ("vq_type3.csv", "vq_contrasts.csv", "judge_beta_coefficients.csv",
                                                           "judge_beta_steps.csv", "retention.csv") if (sc_dir / f).exists()]})
    return records


def pipeline_state(params: dict[str, Any], inputs: list[Path], root: Path = ROOT) -> str:
    """sha256 naming what the tracking stage logs: its params and the bytes of every input.

    Two runs of the pipeline that produced the same evidence have the same state, so
    tracking them again finds the parent already logged instead of adding a duplicate.
    """
    h = hashlib.sha256()
    h.update(repr((params["base"]["profile"], params["tracking"]["experiment"])).encode())
    for top in inputs:
        top = Path(top)
        files = sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else [top]
        for f in files:
            if f.exists():
                h.update(str(f.relative_to(root) if f.is_relative_to(root) else f.name).encode())
                h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def store_dir(uri: str) -> Path | None:
    """The folder of a local sqlite store (its artifacts go beside it), else None."""
    prefix = "sqlite:///"
    return Path(uri[len(prefix):]).parent if uri.startswith(prefix) else None


def _experiment(client: Any, name: str, uri: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        folder = store_dir(uri)
        location = (folder / "artifacts").resolve().as_uri() if folder is not None else None
        exp_id = client.create_experiment(name, artifact_location=location)
    else:
        exp_id = exp.experiment_id
    # a model-training experiment: the UI opens on its runs table, not the GenAI overview
    client.set_experiment_tag(exp_id, "mlflow.experimentKind", "custom_model_development")
    return exp_id


def _logged_parent(client: Any, exp_id: str, state: str, n_children: int) -> str | None:
    """The finished parent already logged for `state` with all its children; partial ones are deleted."""
    from mlflow.entities import ViewType

    found = None
    for run in client.search_runs([exp_id], f"tags.`voicebias.pipeline_state` = '{state}' and "
                                            "tags.`voicebias.level` = 'pipeline'", run_view_type=ViewType.ACTIVE_ONLY):
        kids = client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'",
                                  run_view_type=ViewType.ACTIVE_ONLY, max_results=10000)
        complete = run.info.status == "FINISHED" and len(kids) == n_children and all(
            k.info.status == "FINISHED" for k in kids)
        if complete and found is None:
            found = run.info.run_id
            continue
        for k in kids:  # a killed or duplicate logging of the same state
            client.delete_run(k.info.run_id)
        client.delete_run(run.info.run_id)
    return found


def _run_log_metrics(entries: dict[str, dict[str, Any]]) -> list[Any]:
    from mlflow.entities import Metric

    out = []
    for stage, entry in sorted(entries.items()):
        for key in ("wall_s", "calls", "cache_hits", "attempts", "asr_calls"):
            if isinstance(entry.get(key), (int, float)):
                out.append(Metric(f"run/{stage.replace('@', '/')}/{key}", float(entry[key]), 0, 0))
    return out


def log_pipeline_run(params: dict[str, Any], analysis_dir: Path, gate_dir: Path, manifest_path: Path,
                     out_path: Path, root: Path = ROOT, sc_dir: Path | None = None,
                     phonation_dir: Path | None = None, run_log: Path | None = None) -> dict[str, Any]:
    """Log the parent run and its children, once per pipeline state.

    Writes `out_path` (the store's state marker, a declared DVC output): the pipeline
    state, the experiment and the names of the parent and child runs, all functions of
    the inputs. Run ids, the git commit and this run's wall-clock facts (the run log)
    go to MLflow only, and the ids also to `last_run.json` beside the marker.
    """
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    from voicebias.io import read_json, read_table, write_json
    from voicebias.runlog import latest

    uri = tracking_uri(params, root)
    folder = store_dir(uri)
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(uri)  # no global mlflow.set_tracking_uri: it would leak into the environment
    name = params["tracking"]["experiment"]
    exp_id = _experiment(client, name, uri)
    records = child_records(analysis_dir)
    inputs = [analysis_dir, gate_dir / "metrics.json", gate_dir / "gate.csv", manifest_path]
    if sc_dir is not None and phonation_dir is not None:
        records += sc_child_records(params, sc_dir, phonation_dir)
        inputs += [sc_dir, phonation_dir / "check_metrics.json", phonation_dir / "manipulation_check.csv"]
    state = pipeline_state(params, inputs, root)
    stimulus_set = stimulus_set_hash(read_table(manifest_path))
    parent_name = f"pipeline-{stimulus_set[:8]}-{state[:8]}"
    child_names = [f"{r['system']}/{r['lang']}/{r['task']}" for r in records]
    marker = {"tracking_uri": uri.split("///")[0] + "///" + os.path.relpath(uri.split("///", 1)[1], root)
              if uri.startswith("sqlite:///") else uri,
              "experiment": name, "pipeline_state": state, "stimulus_set": stimulus_set, "parent_run": parent_name,
              "children": sorted(child_names)}

    pid = _logged_parent(client, exp_id, state, len(records))
    reused = pid is not None
    if not reused:
        family = {"voicebias.profile": str(params["base"]["profile"]), "voicebias.stimulus_set": stimulus_set,
                  "voicebias.pipeline_state": state}
        parent = client.create_run(exp_id, run_name=parent_name, tags={
            **family, "voicebias.level": "pipeline", "voicebias.git_commit": git_commit(root),
            "voicebias.dvc_lock": file_hash(root / "dvc.lock")})
        pid = parent.info.run_id
        gate = read_json(gate_dir / "metrics.json")
        client.log_batch(pid, metrics=[Metric("carrier_gate_passed", float(gate["passed"]), 0, 0),
                                       Metric("carrier_gate_flips", float(gate["flips"]), 0, 0),
                                       *_run_log_metrics(latest(run_log))],
                         params=[Param("systems", ",".join(params["run"]["systems"])),
                                 Param("seed", str(params["base"]["seed"])),
                                 Param("tts_backend", str(params["tts"]["backend"])),
                                 Param("classifier", str(params["acoustics"]["classifier"]))])
        client.log_artifact(pid, str(gate_dir / "gate.csv"), "carrier_gate")
        for rec, run_name in zip(records, child_names):
            tags = {**family, "mlflow.parentRunId": pid, "voicebias.level": "system_lang_task",
                    "system": rec["system"], "lang": rec["lang"], "task": rec["task"], **rec["tags"]}
            run = client.create_run(exp_id, run_name=run_name, tags=tags)
            sys_params = params["systems"].get(rec["system"], {})
            client.log_batch(run.info.run_id,
                             metrics=[Metric(k, v, 0, 0) for k, v in sorted(rec["metrics"].items())],
                             params=[Param(f"system.{k}", str(v)) for k, v in sorted(_flat(sys_params).items())])
            for art in rec.get("artifacts", []):
                client.log_artifact(run.info.run_id, str(art), "tables")
            client.set_terminated(run.info.run_id)
        client.set_terminated(pid)
    kids = client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{pid}'", max_results=10000)
    last = {"experiment_id": exp_id, "parent_run_id": pid, "reused": reused,
            "children": sorted(({"run_id": k.info.run_id, "name": k.info.run_name} for k in kids),
                               key=lambda c: c["name"])}
    write_json(Path(out_path).with_name("last_run.json"), last)
    write_json(Path(out_path), marker)  # last: a killed run leaves no marker, so DVC runs tracking again
    return {**marker, **last}
