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


# ---------------------------------------------------------------- keys typed into params

PASTED = "AIzaSyPLANTEDsecret0123456789abcdefXYZ"  # a Google key: a valid identifier, so the shape decides


def _params_with(system: str, settings: dict) -> dict:
    import yaml

    params = yaml.safe_load((config.ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["systems"][system] = settings
    return params


def _problems(params: dict) -> str:
    import pytest

    from voicebias.params import ParamsError, validate_params

    with pytest.raises(ParamsError) as err:
        validate_params(params)
    return str(err.value)


def test_credentials_in_a_base_url_are_refused_by_field_and_never_repeated():
    cases = {
        f"https://user:{PASTED}@api.example.org/v1": "credentials before the host",
        f"https://api.example.org/v1?key={PASTED}": "credential in its query (key=...)",
        f"https://api.example.org/v1?api-version=1&access_token={PASTED}": "(access_token=...)",
    }
    for url, why in cases.items():
        msg = _problems(_params_with("gpt_audio", {"model": "gpt-4o-audio-preview", "base_url": url}))
        assert "systems.gpt_audio.base_url:" in msg and why in msg, msg
        assert PASTED not in msg and PASTED[:12] not in msg
    # a list of endpoints and the judge's address are checked the same way
    msg = _problems(_params_with("qwen2_5_omni_vllm", {"endpoints": [{"url": f"http://u:{PASTED}@gpu:8000/v1"}]}))
    assert "systems.qwen2_5_omni_vllm.endpoints.0.url:" in msg and PASTED not in msg
    import yaml

    params = yaml.safe_load((config.ROOT / "params.yaml").read_text(encoding="utf-8"))
    params["sc_judge"] = {**(params.get("sc_judge") or {}), "base_url": f"http://judge:8000/v1?token={PASTED}"}
    msg = _problems(params)
    assert "sc_judge.base_url:" in msg and PASTED not in msg
    # clean addresses, query settings that are not credentials, and a port pass
    from voicebias.params import validate_params

    ok = _params_with("gpt_audio", {"model": "m", "base_url": "https://api.example.org:8443/v1?api-version=2024-10-01"})
    assert validate_params(ok)["systems"]["gpt_audio"]["base_url"].endswith("api-version=2024-10-01")


def test_a_key_pasted_into_api_key_env_is_refused_by_field_and_never_repeated():
    from voicebias.params import validate_params

    for pasted, why in (
        ("sk-proj-PLANTEDsecret0123456789abcdefXYZ", "starts like one"),
        (PASTED, "starts like one"),
        ("PLANTEDsecret0123456789abcdefXYZ", "long run of mixed letters and digits"),
        ("my key", "must be the name of an environment variable"),
    ):
        msg = _problems(_params_with("gpt_audio", {"model": "m", "api_key_env": pasted}))
        assert "systems.gpt_audio.api_key_env:" in msg and why in msg, msg
        assert pasted not in msg
    for name in ("OPENAI_API_KEY", "AZURE_OPENAI_KEY_2", "my_lab_key"):
        assert validate_params(_params_with("gpt_audio", {"model": "m", "api_key_env": name}))


def test_cards_and_the_endpoints_file_refuse_credentials_and_the_client_never_repeats_a_pasted_key(tmp_path):
    import pytest

    from voicebias.clients.endpoints import parse_endpoints
    from voicebias.errors import ConfigError, SetupError
    from voicebias.secrets import require_secret

    with pytest.raises(ConfigError) as err:
        parse_endpoints([{"url": f"http://lab:{PASTED}@gpu:8000/v1"}], "the card of 'x'", 1)
    assert "the card of 'x': endpoints[0]: 'url' holds credentials" in str(err.value) and PASTED not in str(err.value)
    with pytest.raises(SetupError) as err:  # a card's api_key_env holding the key itself
        require_secret("system 'x'", PASTED, tmp_path, error=SetupError)
    assert "api_key_env holds what looks like a key" in str(err.value) and PASTED not in str(err.value)
