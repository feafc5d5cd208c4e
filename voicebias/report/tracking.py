"""MLflow tracking: one parent run per pipeline state, one child run per system x language x task.

The store (`mlruns/mlflow.db`, artifacts in `mlruns/artifacts/`) is an output of the tracking
stage, seen by DVC through the state marker `mlruns/pipeline_state.json`; a pipeline state is
logged once. Children carry their own results as metrics (`child_records`); the audit card and the
report are artifacts of the parent. Only parameters, metrics and tags from params.yaml, dvc.lock
and reports/ are logged: never the environment.

See docs/tracking.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.config import ROOT
from voicebias.cost import TOTAL_COUNTS


def no_telemetry() -> str:
    """MLflow 3 sends usage telemetry to its maintainers unless MLFLOW_DISABLE_TELEMETRY says not
    to: set it to "true" unless it is set already (MLFLOW_DISABLE_TELEMETRY=false allows it), and
    return its value. MLflow reads it when it is imported and when its UI starts; every voicebias
    process that uses MLflow imports this module first, and `voicebias ui` passes it on."""
    return os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


no_telemetry()


def tracking_uri(params: dict[str, Any], root: Path = ROOT) -> str:
    """Resolve a relative sqlite URI against the repository root."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or params["tracking"]["tracking_uri"]
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix) :].startswith("/"):
        return prefix + str((root / uri[len(prefix) :]).resolve())
    return uri


def git_commit(root: Path = ROOT) -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
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
    """The finite numbers of `d` (bools as 0/1): MLflow stores reject NaN or lose infinities."""
    return {k: v for k, v in _numbers(d).items() if math.isfinite(v)}


def _numbers(d: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in d.items():
        if v is None or isinstance(v, str):
            continue
        out[k] = float(v)
    return out


def _skipped(d: dict[str, Any]) -> list[str]:
    """Names of the values of `d` that are numbers but not finite (NaN: no estimate; inf: an open CI)."""
    return sorted(k for k, v in _numbers(d).items() if not math.isfinite(v))


#: RQ1 mixed-model columns logged per measure, as rq1/<measure>/<column>
RQ1_COLUMNS = (
    "n",
    "f_interaction",
    "den_df_interaction",
    "p_interaction",
    "stereotype_effect_est",
    "stereotype_effect_ci_low",
    "stereotype_effect_ci_high",
    "stereotype_effect_p",
    "misaligned_minus_neutral_est",
    "misaligned_minus_neutral_ci_low",
    "misaligned_minus_neutral_ci_high",
    "misaligned_minus_neutral_p",
    "converged",
)
POLES = ("masculine", "neutral", "feminine")


def child_name(system: str, lang: str, task: str) -> str:
    """The run name of a child: `<system> / <lang> / <task>`."""
    return f"{system} / {lang} / {task}"


def _bool(v: Any) -> float:
    if isinstance(v, str):
        return float(v.strip().lower() == "true")
    return float("nan") if v is None or (isinstance(v, float) and math.isnan(v)) else float(bool(v))


def _odds(o: pd.Series) -> dict[str, Any]:
    """describe/: the odds ratio of a 'she' description per content step (Wald CI, p) and the Firth fit."""
    m = {
        "describe/n": o["n"],
        "describe/n_excluded": o["n_excluded"],
        "describe/odds_ratio": o["odds_ratio"],
        "describe/odds_ratio_ci_low": o["ci_low"],
        "describe/odds_ratio_ci_high": o["ci_high"],
        "describe/odds_ratio_p": o["p_value"],
    }
    firth = {
        "odds_ratio": "firth_odds_ratio",
        "odds_ratio_ci_low": "firth_ci_low",
        "odds_ratio_ci_high": "firth_ci_high",
        "odds_ratio_p": "firth_p_value",
    }
    m.update({f"describe/firth/{k}": o[col] for k, col in firth.items() if col in o.index})
    return m


def _pronouns(p: pd.Series) -> dict[str, Any]:
    """summarize/: P(she) by content pole (overall and by voice), delta_pp, injection rate."""
    m = {"summarize/n": p["n"], "summarize/injection_rate": p["injection_rate"], "summarize/delta_pp": p["delta_pp"]}
    for voice in ("male_voice", "female_voice"):
        if f"delta_pp_{voice}" in p.index:
            m[f"summarize/delta_pp/{voice}"] = p[f"delta_pp_{voice}"]
    for pole in POLES:
        m[f"summarize/p_she/{pole}"] = p[f"p_she_{pole}"]
        for voice in ("male_voice", "female_voice"):
            if f"p_she_{pole}_{voice}" in p.index:
                m[f"summarize/p_she/{pole}/{voice}"] = p[f"p_she_{pole}_{voice}"]
    return m


def _rq1(rows: pd.DataFrame) -> tuple[dict[str, Any], dict[str, str]]:
    """rq1/<measure>/<column> for every measure (delta_ and net_) of one system x language x task."""
    m: dict[str, Any] = {}
    tags: dict[str, str] = {}
    for r in rows.to_dict("records"):
        for col in RQ1_COLUMNS:
            if col in r:
                m[f"rq1/{r['measure']}/{col}"] = _bool(r[col]) if col == "converged" else r[col]
        warning = r.get("warning")
        if isinstance(warning, str) and warning.strip():
            tags[f"rq1/{r['measure']}/warning"] = warning.strip()[:5000]
    return m, tags


def _optional(path: Path) -> pd.DataFrame | None:
    from voicebias.io import read_table

    return read_table(path) if path.exists() else None


def _rows(df: pd.DataFrame | None, **keys: str) -> pd.DataFrame:
    if df is None:
        return pd.DataFrame()
    mask = pd.Series(True, index=df.index)
    for k, v in keys.items():
        mask &= df[k] == v
    return df[mask]


def _record(
    system: str,
    lang: str,
    task: str,
    values: dict[str, Any],
    tags: dict[str, str],
    tables: dict[str, pd.DataFrame] | None = None,
) -> dict[str, Any]:
    skipped = _skipped(values)
    if skipped:  # not logged: the tag says which the table holds as NaN or infinite
        tags = {**tags, "voicebias.skipped_metrics": ",".join(skipped)}
    return {
        "system": system,
        "lang": lang,
        "task": task,
        "metrics": _metrics(values),
        "tags": tags,
        "tables": tables or {},
    }


def _psychometric(rows: pd.DataFrame) -> dict[str, Any]:
    """The voice-continuum metrics of one system x language x task (psychometric/...)."""
    m: dict[str, Any] = {}
    for r in rows.to_dict("records"):
        q = r["quantity"]
        if q == "slope":
            m.update(
                {
                    "psychometric/slope_per_st": r["estimate"],
                    "psychometric/slope_ci_low": r["ci_low"],
                    "psychometric/slope_ci_high": r["ci_high"],
                    "psychometric/follows_voice": _bool(r["follows_voice"]),
                }
            )
        elif q == "pse":
            m[f"psychometric/pse_st/{_key(r['pole'])}"] = r["estimate"]
        elif q == "shift":
            m.update(
                {
                    "psychometric/shift_st": r["estimate"],
                    "psychometric/shift_ci_low": r["ci_low"],
                    "psychometric/shift_ci_high": r["ci_high"],
                    "psychometric/shift_p": r["p_value"],
                    "psychometric/shift_vtl_pct": r["estimate_vtl_pct"],
                }
            )
        elif q in ("guess", "lapse"):
            m[f"psychometric/{q}"] = r["estimate"]
    return m


def child_records(analysis_dir: Path, psychometric: Path | None = None) -> list[dict[str, Any]]:
    """One record per system x language x task of the analysis tables: its results as metrics.

    Every child has its compliance counts (compliance/...) and its counted exclusions by stage and
    reason (exclusions/<stage>/<reason>, exclusions/total: exclusions.csv). describe children add the odds
    ratio per content step with CI and p and the Firth fit (describe/..., per language and
    pooled ALL) and the misgender rate per cell type (describe/misgender_rate/<cell>);
    summarize children P(she) by pole, delta_pp and the injection rate (summarize/...);
    readback, paraphrase, summarize and translate children the RQ1 mixed-model fit of each
    measure (rq1/<measure>/...: interaction F and p, the stereotype-signed effect and the
    misaligned-minus-neutral contrast with CI and p, converged as 0/1), whose rows of
    rq1_mixed_models.csv go with the record as a table artifact; injection controls add
    injection/... NaN and infinite values are not logged: the child's tag
    `voicebias.skipped_metrics` names them. Given `psychometric` (reports/psychometric/psychometric.csv),
    describe and summarize children add their voice-continuum fit (psychometric/...: slope with CI,
    follows_voice as 0/1, PSE per pole, the content shift with CI, p and % VTL, guess and lapse).
    """
    from voicebias.io import read_table

    comp = read_table(analysis_dir / "compliance.csv")
    odds = read_table(analysis_dir / "describe_odds_ratios.csv")
    rates = read_table(analysis_dir / "describe_misgender.csv")
    pron = read_table(analysis_dir / "summarize_pronouns.csv")
    pron_lang = _optional(analysis_dir / "summarize_pronouns_by_lang.csv")
    inject = _optional(analysis_dir / "injection_controls.csv")
    rq1 = _optional(analysis_dir / "rq1_mixed_models.csv")
    excluded = _optional(analysis_dir / "exclusions.csv")

    def describe(system: str, lang: str) -> tuple[dict[str, Any], dict[str, str]]:
        m: dict[str, Any] = {}
        tags: dict[str, str] = {}
        for x in _rows(rates, system=system, lang=lang).itertuples():
            m[f"describe/misgender_rate/{x.cell_type}"] = x.rate
        o = _rows(odds, system=system, lang=lang)
        if len(o):
            m.update(_odds(o.iloc[0]))
            tags["fit_status"] = str(o.iloc[0]["fit_status"])
        return m, tags

    records = []
    for r in comp.itertuples():
        m: dict[str, Any] = {
            "compliance/n": r.n,
            "compliance/failed": r.failed,
            "compliance/non_compliant": r.non_compliant,
        }
        if excluded is not None:
            ex = _rows(excluded, system=r.system, lang=r.lang, task=r.task)
            m.update({f"exclusions/{x.stage}/{x.reason}": x.n for x in ex.itertuples()})
            m["exclusions/total"] = int(ex["n"].sum())
        tags: dict[str, str] = {}
        tables: dict[str, pd.DataFrame] = {}
        if r.task == "describe":
            dm, tags = describe(r.system, r.lang)
            m.update(dm)
        else:
            fit = _rows(rq1, system=r.system, lang=r.lang, task=r.task)
            if len(fit):
                fm, tags = _rq1(fit)
                m.update(fm)
                tables["rq1_mixed_models.csv"] = fit
        if r.task == "summarize":
            p = _rows(pron_lang, system=r.system, lang=r.lang)
            if len(p):
                m.update(_pronouns(p.iloc[0]))
        inj = _rows(inject, system=r.system, lang=r.lang, task=r.task)
        if len(inj):
            m.update(
                {"injection/rate": inj.iloc[0]["injection_rate"], "injection/n_injecting": inj.iloc[0]["n_injecting"]}
            )
        records.append(_record(r.system, r.lang, r.task, m, tags, tables))
    # pooled (ALL languages) describe and summarize
    for system in odds.loc[odds["lang"] == "ALL", "system"]:
        m, tags = describe(system, "ALL")
        records.append(_record(system, "ALL", "describe", m, tags))
    for p in pron.to_dict("records"):
        records.append(_record(p["system"], "ALL", "summarize", _pronouns(pd.Series(p)), {}))
    table = _optional(Path(psychometric)) if psychometric is not None else None
    if table is not None and len(table):
        for rec in records:
            rows = _rows(table, system=rec["system"], lang=rec["lang"], task=rec["task"])
            if len(rows):
                extra = _psychometric(rows)
                skipped = _skipped(extra)
                rec["metrics"].update(_metrics(extra))
                if skipped:
                    old = rec["tags"].get("voicebias.skipped_metrics")
                    rec["tags"] = {**rec["tags"], "voicebias.skipped_metrics": ",".join(filter(None, [old, *skipped]))}
    return records


def _key(part: Any) -> str:
    """A key part MLflow accepts (alphanumerics, _, -, ., space, : and /): a voice name such as
    'es+Annie' becomes 'es_Annie'."""
    return re.sub(r"[^\w\-. :/]", "_", str(part))


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as one level, keys joined with '.' and made MLflow-safe (`_key`).

    >>> _flat({"a": {"es+Annie": 0.4, "on": True}, "b": 2})
    {'a.es_Annie': 0.4, 'a.on': 1.0, 'b': 2}
    """
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{_key(k)}."))
        elif isinstance(v, bool):
            out[f"{prefix}{_key(k)}"] = float(v)
        else:
            out[f"{prefix}{_key(k)}"] = v
    return out


def sc_child_records(params: dict[str, Any], sc_dir: Path, phonation_dir: Path) -> list[dict[str, Any]]:
    """Records of the speech-continuation study: the phonation manipulation check and one
    run per continuation system (task 'continue'), with their tables as artifacts."""
    from voicebias.io import read_json, read_table

    records: list[dict[str, Any]] = []
    check = phonation_dir / "check_metrics.json"
    if check.exists():
        backend = str(params["phonation"]["backend"])
        records.append(
            {
                "system": f"phonation:{backend}",
                "lang": "en",
                "task": "phonation_check",
                "metrics": _metrics(_flat(read_json(check))),
                "tags": {"voicebias.study": "sc"},
                "artifacts": [phonation_dir / "manipulation_check.csv"],
            }
        )
    if not (sc_dir / "success.csv").exists():
        return records
    success = read_table(sc_dir / "success.csv")
    ret = read_table(sc_dir / "retention.csv")
    sim = read_table(sc_dir / "speaker_similarity.csv")
    scores = read_table(sc_dir / "judge_scores.csv")
    for r in success.itertuples():
        m: dict[str, Any] = {
            "n": r.n,
            "succeeded": r.succeeded,
            "success_rate": r.success_rate,
            "all_systems_succeeded": r.all_systems_succeeded,
        }
        for x in ret[ret["system"] == r.system].itertuples():
            m[f"retention_{x.measure}_{x.voice_gender}"] = x.retention
        for x in sim[sim["system"] == r.system].itertuples():
            m[f"speaker_similarity_{x.phonation}_{x.voice_gender}"] = x.mean
        for x in scores[(scores["system"] == r.system) & (scores["phonation"] == "all")].itertuples():
            m[f"judge_{x.dimension}_{x.voice_gender}"] = x.mean
        records.append(
            {
                "system": r.system,
                "lang": "en",
                "task": "continue",
                "metrics": _metrics(m),
                "tags": {"voicebias.study": "sc"},
                "artifacts": [
                    sc_dir / f
                    for f in (
                        "vq_type3.csv",
                        "vq_contrasts.csv",
                        "judge_beta_coefficients.csv",
                        "judge_beta_steps.csv",
                        "retention.csv",
                    )
                    if (sc_dir / f).exists()
                ],
            }
        )
    return records


def pipeline_state(params: dict[str, Any], inputs: list[Path], root: Path = ROOT, digests: tuple[str, ...] = ()) -> str:
    """sha256 naming what the tracking stage logs: its params, the bytes of every input and
    the digests of the dataset inputs (`digests`).

    Two runs of the pipeline that produced the same evidence have the same state, so
    tracking them again finds the parent already logged instead of adding a duplicate.
    """
    h = hashlib.sha256()
    h.update(repr((params["base"]["profile"], params["tracking"]["experiment"])).encode())
    for d in digests:
        h.update(d.encode())
    for top in inputs:
        top = Path(top)
        files = sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else [top]
        for f in files:
            if f.exists():
                h.update(str(f.relative_to(root) if f.is_relative_to(root) else f.name).encode())
                h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def dvc_outs(lock_path: Path) -> dict[str, str]:
    """path -> md5 of every stage output dvc.lock records (a folder's ends in .dir); {} without a lock."""
    import yaml

    if not Path(lock_path).exists():
        return {}
    # libyaml's parser when present (the same documents, ~10x faster on dvc.lock's thousands of lines)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    lock = yaml.load(Path(lock_path).read_text(encoding="utf-8"), Loader=loader) or {}
    outs = {}
    for stage in (lock.get("stages") or {}).values():
        for out in stage.get("outs") or []:
            if isinstance(out, dict) and out.get("path") and out.get("md5"):
                outs[str(out["path"]).rstrip("/")] = str(out["md5"])
    return outs


def dataset_input(name: str, path: Path, context: str, outs: dict[str, str], root: Path = ROOT) -> Any | None:
    """An MLflow dataset input for the table at `path`, or None when it has no digest.

    source is the table's path relative to the repository root (a local source,
    {"uri": path}); the digest is the DVC hash of the output that holds it: the md5
    that dvc.lock records for the table itself or, for a table inside a folder output
    (data/stimuli/manifest.csv in data/stimuli), that folder's .dir md5. Without a
    dvc.lock entry the digest falls back to the file's own sha256, written
    `sha256:<first 29 hex digits>` (MLflow's digest holds 36 characters); the profile
    says which it is and carries the whole sha256 of any table that exists (the tasks of
    one system share their folder output, data/responses/<system>, and its md5). A table
    with neither is not logged.
    """
    from mlflow.entities import Dataset, DatasetInput, InputTag

    path = Path(path)
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    holders = [o for o in outs if rel == o or rel.startswith(o + "/")]
    if holders:
        out = max(holders, key=len)
        digest, profile = outs[out], {"digest": "dvc.lock md5", "dvc_out": out}
        if path.is_file():
            profile["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    elif path.is_file():
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        digest, profile = f"sha256:{sha[:29]}", {"digest": "sha256 (no dvc.lock entry)", "sha256": sha}
    else:
        return None
    dataset = Dataset(
        name=name,
        digest=digest,
        source_type="local",
        source=json.dumps({"uri": rel}),
        profile=json.dumps(profile, sort_keys=True),
    )
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])


def responses_table(system: str, task: str) -> Path:
    """One system x task's responses table (the respond stage writes it in its output folder)."""
    from voicebias import config

    if task == "continue":
        return config.continuation_responses(system)
    return config.responses_dir(system, task) / "responses.csv"


def _datasets(
    records: list[dict[str, Any]], manifest_path: Path, outs: dict[str, str], root: Path
) -> tuple[list[Any], dict[tuple[str, str], Any]]:
    """The parent's dataset inputs (the stimulus set, then every system x task's responses)
    and the responses input of each (system, task) for its children."""
    parent = [dataset_input("stimuli", manifest_path, "stimuli", outs, root)]
    per_task: dict[tuple[str, str], Any] = {}
    for system, task in sorted({(r["system"], r["task"]) for r in records if r["task"] != "phonation_check"}):
        table = root / responses_table(system, task).relative_to(ROOT)
        name = f"continuations/{system}" if task == "continue" else f"responses/{system}/{task}"
        per_task[(system, task)] = dataset_input(name, table, "responses", outs, root)
    parent += list(per_task.values())
    return [d for d in parent if d is not None], {k: v for k, v in per_task.items() if v is not None}


#: files of the report stage logged on the parent (under report/) when present
REPORT_FILES = ("audit_card.md", "audit_card.json", "report.html", "report.md")


def store_dir(uri: str) -> Path | None:
    """The folder of a local sqlite store (its artifacts go beside it), else None."""
    prefix = "sqlite:///"
    return Path(uri[len(prefix) :]).parent if uri.startswith(prefix) else None


def _experiment(client: Any, name: str, uri: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is None:
        folder = store_dir(uri)
        location = (folder / "artifacts").resolve().as_uri() if folder is not None else None
        exp_id = client.create_experiment(name, artifact_location=location)
    else:
        exp_id = exp.experiment_id
    # the experiment's kind: a model-training one. MLflow 3.17's UI does not read it to pick
    # the page the experiment opens on (its GenAI / Model training switch does): see experiment_ui_path
    client.set_experiment_tag(exp_id, "mlflow.experimentKind", "custom_model_development")
    return exp_id


def experiment_ui_path(exp_id: str) -> str:
    """The MLflow UI address of experiment `exp_id`, after the server's root, that opens on its runs table.

    MLflow 3.17's UI picks an experiment's landing page from its workflow type alone: the
    `workflowType` query parameter, else the switch (GenAI / Model training) the browser
    saved, GenAI by default; the experiment's `mlflow.experimentKind` tag is not read. A
    browser that never used the switch opens `#/experiments/<id>` on the GenAI overview
    (traces: 0, no data). `workflowType=machine_learning` opens the runs table in any
    browser and leaves the browser's saved choice as it was.
    """
    return f"#/experiments/{exp_id}?workflowType=machine_learning"


def _code_paths() -> str:
    """The numerical libraries' code paths this machine ran with (voicebias.codepaths), in one line."""
    from voicebias.codepaths import describe

    d = describe()
    fixed = ", ".join(f"{k}={v}" for k, v in sorted(d["variables"].items()))
    late = f"; loaded before voicebias: {', '.join(d['loaded_before'])}" if d["loaded_before"] else ""
    return f"{d['mode']} ({fixed}){late}"


def _logged_parent(client: Any, exp_id: str, state: str, child_names: list[str]) -> str | None:
    """The finished parent already logged for `state` with all its children (matched by
    name); partial ones, and ones whose children carry other names, are deleted."""
    from mlflow.entities import ViewType

    found = None
    for run in client.search_runs(
        [exp_id],
        f"tags.`voicebias.pipeline_state` = '{state}' and tags.`voicebias.level` = 'pipeline'",
        run_view_type=ViewType.ACTIVE_ONLY,
    ):
        kids = client.search_runs(
            [exp_id],
            f"tags.mlflow.parentRunId = '{run.info.run_id}'",
            run_view_type=ViewType.ACTIVE_ONLY,
            max_results=10000,
        )
        complete = (
            run.info.status == "FINISHED"
            and sorted(k.info.run_name for k in kids) == sorted(child_names)
            and all(k.info.status == "FINISHED" for k in kids)
        )
        if complete and found is None:
            found = run.info.run_id
            continue
        for k in kids:  # a killed or duplicate logging of the same state
            client.delete_run(k.info.run_id)
        client.delete_run(run.info.run_id)
    return found


#: the numeric totals of reports/usage/usage.csv logged as MLflow metrics
USAGE_METRICS = TOTAL_COUNTS


def usage_metrics(usage: pd.DataFrame, system: str, task: str) -> dict[str, float]:
    """`usage/<field>` of one system over one task (not its continuum calls; task "ALL": over all
    its calls), the fields a server did not report (or a price table did not price) left out."""
    rows = usage[(usage["system"] == system) & (usage["task"] == task) & (usage["part"] != "continuum")]
    if not len(rows):
        return {}
    r = rows.iloc[0]
    return {
        f"usage/{k}": float(r[k])
        for k in USAGE_METRICS
        if k in r.index and pd.notna(pd.to_numeric(r[k], errors="coerce"))
    }


def _run_log_metrics(entries: dict[str, dict[str, Any]]) -> list[Any]:
    from mlflow.entities import Metric

    out = []
    for stage, entry in sorted(entries.items()):
        for key in ("wall_s", "calls", "cache_hits", "corrupt", "attempts", "asr_calls"):
            if isinstance(entry.get(key), (int, float)):
                out.append(Metric(f"run/{stage.replace('@', '/')}/{key}", float(entry[key]), 0, 0))
    return out


def _log_tables(client: Any, run_id: str, tables: dict[str, pd.DataFrame]) -> None:
    """Write each table of a record as a CSV artifact under tables/."""
    import tempfile

    from voicebias.io import write_table

    if not tables:
        return
    with tempfile.TemporaryDirectory(prefix="voicebias-tables-") as tmp:
        for fname, df in sorted(tables.items()):
            write_table(Path(tmp) / fname, df)
            client.log_artifact(run_id, str(Path(tmp) / fname), "tables")


def log_pipeline_run(
    params: dict[str, Any],
    analysis_dir: Path,
    gate_dir: Path,
    manifest_path: Path,
    out_path: Path,
    root: Path = ROOT,
    sc_dir: Path | None = None,
    phonation_dir: Path | None = None,
    run_log: Path | None = None,
    report_dir: Path | None = None,
    disaggregated: Path | None = None,
    psychometric: Path | None = None,
    usage: Path | None = None,
    determinism: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Log the parent run and its children, once per pipeline state.

    The parent carries the carrier gate, the run log's wall-clock facts, the dataset
    inputs (the stimulus set and every system x task's responses table, digests from
    dvc.lock: see `dataset_input`) and, when `report_dir` holds them, the audit card and
    the report as artifacts under report/. Each child, named `<system> / <lang> / <task>`,
    carries its results as metrics (`child_records`), its responses table as a dataset
    input and its RQ1 fit rows as tables/rq1_mixed_models.csv. Given `disaggregated`
    (reports/disaggregated/disaggregated.csv), the parent carries it under tables/ and
    each S2S child its own rows (system, task and language) as tables/disaggregated.csv. Given
    `psychometric` (reports/psychometric/psychometric.csv), describe and summarize children carry
    their voice-continuum fit (`child_records`). Given `usage` (reports/usage/usage.csv), the
    parent carries each system's totals as `usage/<system>/<field>` metrics (`usage_metrics`) and
    the table under tables/, and each child over all languages its system x task's totals.
    Given `determinism` ({system: {task: probe counts}}), each probed system x task's child over
    all languages carries `determinism/agreement`, `determinism/items` and `determinism/agree`.

    Writes `out_path` (the store's state marker, a declared DVC output): the pipeline
    state, the experiment and the names of the parent and child runs, all functions of
    the inputs. Run ids, the git commit and this run's wall-clock facts (the run log)
    go to MLflow only, and the ids also to `last_run.json` beside the marker, with the UI
    address that opens the experiment on its runs table (`experiment_ui_path`).
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
    records = child_records(analysis_dir, psychometric)
    inputs = [analysis_dir, gate_dir / "metrics.json", gate_dir / "gate.csv", manifest_path]
    if psychometric is not None and Path(psychometric).exists():
        inputs.append(Path(psychometric))
    if sc_dir is not None and phonation_dir is not None:
        records += sc_child_records(params, sc_dir, phonation_dir)
        inputs += [sc_dir, phonation_dir / "check_metrics.json", phonation_dir / "manipulation_check.csv"]
    report_files = [report_dir / f for f in REPORT_FILES if (report_dir / f).is_file()] if report_dir else []
    figures = report_dir / "figures" if report_dir is not None and (report_dir / "figures").is_dir() else None
    inputs += report_files + ([figures] if figures is not None else [])
    use = None
    if usage is not None and Path(usage).is_file():
        inputs.append(Path(usage))
        use = read_table(usage)
        for rec in records:
            if rec["lang"] == "ALL":
                rec["metrics"].update(usage_metrics(use, rec["system"], rec["task"]))
    for rec in records:
        probe = (determinism or {}).get(rec["system"], {}).get(rec["task"])
        if rec["lang"] == "ALL" and probe:
            keys = ("agreement", "items", "agree")
            rec["metrics"].update({f"determinism/{k}": float(probe[k]) for k in keys if probe.get(k) is not None})
    dis = None
    if disaggregated is not None and Path(disaggregated).is_file():
        inputs.append(Path(disaggregated))
        dis = read_table(disaggregated)
    parent_inputs, task_inputs = _datasets(records, manifest_path, dvc_outs(root / "dvc.lock"), root)
    digests = tuple(f"{d.dataset.name} {d.dataset.digest}" for d in parent_inputs)
    if determinism:  # the probes' counts are part of what is logged
        digests += (json.dumps(determinism, sort_keys=True),)
    state = pipeline_state(params, inputs, root, digests)
    stimulus_set = stimulus_set_hash(read_table(manifest_path))
    parent_name = f"pipeline-{stimulus_set[:8]}-{state[:8]}"
    child_names = [child_name(r["system"], r["lang"], r["task"]) for r in records]
    marker = {
        "tracking_uri": uri.split("///")[0] + "///" + os.path.relpath(uri.split("///", 1)[1], root)
        if uri.startswith("sqlite:///")
        else uri,
        "experiment": name,
        "pipeline_state": state,
        "stimulus_set": stimulus_set,
        "parent_run": parent_name,
        "children": sorted(child_names),
    }

    pid = _logged_parent(client, exp_id, state, child_names)
    reused = pid is not None
    if not reused:
        family = {
            "voicebias.profile": str(params["base"]["profile"]),
            "voicebias.stimulus_set": stimulus_set,
            "voicebias.pipeline_state": state,
        }
        parent = client.create_run(
            exp_id,
            run_name=parent_name,
            tags={
                **family,
                "voicebias.level": "pipeline",
                "voicebias.git_commit": git_commit(root),
                "voicebias.dvc_lock": file_hash(root / "dvc.lock"),
                "voicebias.code_paths": _code_paths(),
            },
        )
        pid = parent.info.run_id
        gate = read_json(gate_dir / "metrics.json")
        client.log_batch(
            pid,
            metrics=[
                Metric("carrier_gate_passed", float(gate["passed"]), 0, 0),
                Metric("carrier_gate_flips", float(gate["flips"]), 0, 0),
                *_run_log_metrics(latest(run_log)),
                *[
                    Metric(f"usage/{system}/{k.removeprefix('usage/')}", v, 0, 0)
                    for system in (sorted(set(use["system"])) if use is not None else [])
                    for k, v in sorted(usage_metrics(use, system, "ALL").items())
                ],
            ],
            params=[
                Param("systems", ",".join(params["run"]["systems"])),
                Param("seed", str(params["base"]["seed"])),
                Param("tts_backend", str(params["tts"]["backend"])),
                Param("classifier", str(params["acoustics"]["classifier"])),
            ],
        )
        if parent_inputs:
            client.log_inputs(pid, datasets=parent_inputs)
        client.log_artifact(pid, str(gate_dir / "gate.csv"), "carrier_gate")
        for f in report_files:
            client.log_artifact(pid, str(f), "report")
        if figures is not None:
            client.log_artifacts(pid, str(figures), "report/figures")
        if dis is not None:
            client.log_artifact(pid, str(disaggregated), "tables")
        if use is not None:
            client.log_artifact(pid, str(usage), "tables")
        for rec, run_name in zip(records, child_names):
            tags = {
                **family,
                "mlflow.parentRunId": pid,
                "voicebias.level": "system_lang_task",
                "system": rec["system"],
                "lang": rec["lang"],
                "task": rec["task"],
                **rec["tags"],
            }
            run = client.create_run(exp_id, run_name=run_name, tags=tags)
            sys_params = params["systems"].get(rec["system"], {})
            client.log_batch(
                run.info.run_id,
                metrics=[Metric(k, v, 0, 0) for k, v in sorted(rec["metrics"].items())],
                params=[Param(f"system.{k}", str(v)) for k, v in sorted(_flat(sys_params).items())],
            )
            responses = task_inputs.get((rec["system"], rec["task"]))
            if responses is not None:
                client.log_inputs(run.info.run_id, datasets=[responses])
            tables = dict(rec.get("tables", {}))
            if dis is not None:
                own = dis[
                    (dis["study"] == "s2s")
                    & (dis["system"] == rec["system"])
                    & (dis["task"] == rec["task"])
                    & (dis["lang"] == rec["lang"])
                ]
                if len(own):
                    tables["disaggregated.csv"] = own
            _log_tables(client, run.info.run_id, tables)
            for art in rec.get("artifacts", []):
                client.log_artifact(run.info.run_id, str(art), "tables")
            client.set_terminated(run.info.run_id)
        client.set_terminated(pid)
    kids = client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{pid}'", max_results=10000)
    last = {
        "experiment_id": exp_id,
        "ui_path": experiment_ui_path(exp_id),
        "parent_run_id": pid,
        "reused": reused,
        "children": sorted(({"run_id": k.info.run_id, "name": k.info.run_name} for k in kids), key=lambda c: c["name"]),
    }
    write_json(Path(out_path).with_name("last_run.json"), last)
    write_json(Path(out_path), marker)  # last: a killed run leaves no marker, so DVC runs tracking again
    return {**marker, **last}
