"""A planted API key never lands in mlflow.db, reports/, data/, the cache or logs after a run.

The run goes through the respond stage (run_stage) with the OpenAI adapter against
a fake server that rate-limits some calls and, for one stimulus, answers 401 with
the key echoed in its message (careless servers do); every logger runs at DEBUG
into logs/, the stage's console output is saved there too, and the run is then
logged to MLflow (sqlite) with the project's tracking code. Every byte under the
project folder is then searched for the key.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pandas as pd

from tests.fakes.openai_server import FakeOpenAIAudioServer, fingerprint_file
from tests.fakes.stimuli import make_stimuli
from voicebias import config

KEY = "sk-proj-PLANTEDsecret0123456789abcdefXYZ"


def _files_containing(root: Path, needle: bytes) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        if p.is_file() and needle in p.read_bytes():
            hits.append(str(p.relative_to(root)))
    return hits


def test_planted_key_never_stored_or_logged(tmp_path, monkeypatch, capfd):
    from voicebias.io import write_json, write_table
    from voicebias.pipeline.respond import run_stage
    from voicebias.report.tracking import log_pipeline_run

    root = tmp_path / "proj"
    stim = make_stimuli(root, 6)
    manifest = root / "data" / "stimuli" / "manifest.csv"
    stim.to_csv(manifest, index=False)
    passages = root / "data" / "passages" / "passages.csv"
    passages.parent.mkdir(parents=True)
    pd.DataFrame({"passage_id": stim["passage_id"]}).to_csv(passages, index=False)
    gate = root / "reports" / "carrier_gate"
    write_json(gate / "metrics.json", {"passed": True, "flips": 0})
    (gate / "gate.csv").write_text("measure,passed\nf0,True\n")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (root / "logs").mkdir()
    handler = logging.FileHandler(root / "logs" / "debug.log")
    logging.getLogger().addHandler(handler)
    old_level = logging.getLogger().level
    logging.getLogger().setLevel(logging.DEBUG)
    fps = [fingerprint_file(root / p) for p in stim["path"]]
    plan = {fps[0]: ["401echo"], fps[1]: ["429"], fps[2]: ["500", "429"]}
    try:
        with FakeOpenAIAudioServer(KEY, plan=plan) as server:
            params = {
                "base": {"seed": 1, "profile": "test"},
                "tts": {"rate_wpm": 160, "backend": "espeak"},
                "run": {"systems": ["gpt_audio"], "max_failed_fraction": 0.5},
                "acoustics": {"classifier": "acoustic_norms"},
                "tracking": {"tracking_uri": "sqlite:///mlflow.db", "experiment": "secrets"},
                "systems": {
                    "gpt_audio": {
                        "model": "gpt-4o-audio-preview",
                        "base_url": server.base_url,
                        "retry": {"max_attempts": 3, "base_delay_s": 0.01},
                    }
                },
            }
            table = run_stage(
                params,
                system="gpt_audio",
                manifest_path=manifest,
                passages_path=passages,
                gate_metrics=gate / "metrics.json",
                responses_dir_for=lambda t: root / "data" / "responses" / "gpt_audio" / t,
                report_for=lambda t: root / "reports" / "respond" / f"gpt_audio-{t}.json",
                planted_truth_path=root / "reports" / "respond" / "gpt_audio-planted_truth.json",
                cache_dir=root / ".cache" / "responses",
                root=root,
                task_names=["describe"],
            )["describe"]
    finally:
        logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(old_level)
        handler.close()
    # the key was really used and really echoed back, so there was something to leak
    assert server.log and all(e.outcome != "401" for e in server.log)
    row = table.set_index("stimulus_id").loc[stim.stimulus_id[0]]
    assert row.status == "failed" and "Incorrect API key provided: [redacted]" in row.error
    assert (table.status == "ok").sum() == 5
    # the run is logged to MLflow as the pipeline does it
    analysis = root / "reports" / "analysis"
    comp = (
        table.assign(failed=table.status.eq("failed"))
        .groupby(["system", "lang", "task"], as_index=False)
        .agg(n=("status", "size"), failed=("failed", "sum"))
    )
    write_table(analysis / "compliance.csv", comp.assign(non_compliant=0))
    write_table(
        analysis / "describe_odds_ratios.csv",
        pd.DataFrame(
            columns=["system", "lang", "odds_ratio", "ci_low", "ci_high", "p_value", "fit_status", "n", "n_excluded"]
        ),
    )
    write_table(analysis / "describe_misgender.csv", pd.DataFrame(columns=["system", "lang", "cell_type", "rate"]))
    write_table(
        analysis / "summarize_pronouns.csv",
        pd.DataFrame(columns=["system", "delta_pp", "injection_rate", "delta_pp_male_voice", "delta_pp_female_voice"]),
    )
    shutil.copy(config.ROOT / "dvc.yaml", root / "dvc.yaml")
    log_pipeline_run(params, analysis, gate, manifest, root / "reports" / "tracking" / "run.json", root=root)
    out, err = capfd.readouterr()
    (root / "logs" / "console.log").write_text(out + err)
    assert (root / "mlflow.db").exists() and (root / "logs" / "debug.log").stat().st_size > 0
    assert _files_containing(root, KEY.encode()) == []
    assert _files_containing(root, KEY[8:24].encode()) == []  # nor a recognisable piece of it
    assert os.environ["OPENAI_API_KEY"] == KEY  # (sanity: the key was there all along)
