"""The voicebias command: profiles, preflight and re-analysis from a table alone."""

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from voicebias import cli, config
from voicebias.cli.profiles import resolve_profile, write_profile
from voicebias.params import load_params, validate_params
from voicebias.systems.reference import planted_p_female


def test_embedded_profile_is_the_committed_params():
    assert (config.ROOT / "params.yaml").read_text() == (config.PROFILES_DIR / "embedded.yaml").read_text()
    assert validate_params(resolve_profile("embedded")) == load_params(config.ROOT / "params.yaml")


def test_paper_profile_round_trip(tmp_path):
    params_path = tmp_path / "params.yaml"
    write_profile("paper", params_path)
    paper = yaml.safe_load(params_path.read_text())
    assert paper["base"]["profile"] == "paper"
    assert "gpt_audio" in paper["run"]["systems"] and "voice_faithful" not in paper["systems"]
    assert paper["tasks"] == resolve_profile("embedded")["tasks"]  # untouched sections carry over
    write_profile("embedded", params_path)
    assert yaml.safe_load(params_path.read_text()) == resolve_profile("embedded")


def test_preflight_names_what_the_paper_profile_lacks(capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert cli.main(["preflight", "--profile", "paper"]) == 1
    out = capsys.readouterr().out
    assert "Not ready" in out
    assert "OPENAI_API_KEY is not set" in out
    assert "adapter 'openai_audio'" in out
    assert "external/Kimi-Audio is missing" in out
    assert "Traceback" not in out


def test_preflight_passes_on_the_embedded_default(capsys):
    assert cli.main(["preflight", "--profile", "embedded"]) == 0
    assert "Ready" in capsys.readouterr().out


def test_preflight_reads_keys_from_dotenv(tmp_path, monkeypatch):
    from voicebias.cli.preflight import preflight

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    (tmp_path / ".env").write_text("OPENAI_API_KEY=sk-from-dotenv\n")
    (tmp_path / "models" / "cards").mkdir(parents=True)
    (tmp_path / "models" / "cards" / "gpt_audio.yaml").write_text((config.CARDS_DIR / "gpt_audio.yaml").read_text())
    params = resolve_profile("paper")
    params["run"]["systems"] = ["gpt_audio"]
    checks = [c for c in preflight(params, root=tmp_path) if "OPENAI_API_KEY" in c.detail]
    assert checks and checks[0].ok
    assert all("sk-from-dotenv" not in c.detail for c in preflight(params, root=tmp_path))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def test_analyze_describe_from_a_shared_table(tmp_path, capsys):
    rng = np.random.default_rng(11)
    params = {"rule": "content", "error_rate": 0.1, "neutral_p_female": 0.5}
    rows = []
    for pole in ("masculine", "neutral", "feminine"):
        for voice in ("male", "female"):
            for i in range(40):
                word = "female" if rng.random() < planted_p_female(params, pole, voice) else "male"
                rows.append(
                    {
                        "system": "shared",
                        "task": "describe",
                        "lang": "en",
                        "pole": pole,
                        "voice_gender": voice,
                        "stimulus_id": f"{pole}-{voice}-{i}",
                        "transcript": word,
                    }
                )
    table = tmp_path / "shared.csv"
    pd.DataFrame(rows).to_csv(table, index=False)
    assert cli.main(["analyze", "describe", str(table), "--out", str(tmp_path / "out")]) == 0
    odds = pd.read_csv(tmp_path / "out" / "describe_odds_ratios.csv")
    row = odds[odds["lang"] == "ALL"].iloc[0]
    assert row["fit_status"] == "ok" and row["odds_ratio"] > 5 and row["p_value"] < 1e-6
    # --confidence applies to every table, the exact (Fisher) intervals included
    assert cli.main(["analyze", "describe", str(table), "--confidence", "0.8", "--out", str(tmp_path / "out80")]) == 0
    f95 = pd.read_csv(tmp_path / "out" / "describe_fisher.csv")
    f80 = pd.read_csv(tmp_path / "out80" / "describe_fisher.csv")
    assert (f80["ci_low"] > f95["ci_low"]).all() and (f80["ci_high"] < f95["ci_high"]).all()
    o80 = pd.read_csv(tmp_path / "out80" / "describe_odds_ratios.csv")
    assert (o80["ci_low"] > odds["ci_low"]).all() and (o80["odds_ratio"] == odds["odds_ratio"]).all()


def test_analyze_rq1_prints_the_tables_the_analysis_stage_writes(tmp_path):
    """The text-controlled net_ measures included: the command and the stage build the RQ1 tables
    with one function (voicebias.analysis.rq1.rq1_tables), so they are the same tables."""
    from tests.support.stats import deltas
    from voicebias.analysis.rq1 import rq1_tables
    from voicebias.io import read_table, write_table

    d = deltas(drift=0.3, seed=4)
    d["delta_f0_median_st"] = d["delta_composite"] * 2
    d["net_composite"] = d["delta_composite"] - 0.1
    d["net_f0_median_st"] = d["delta_f0_median_st"] + 0.2
    write_table(tmp_path / "s_acoustics.csv", d)
    assert cli.main(["analyze", "rq1", str(tmp_path / "s_acoustics.csv"), "--out", str(tmp_path / "out")]) == 0
    stage = rq1_tables(read_table(tmp_path / "s_acoustics.csv"), 0.95)
    assert set(stage) == {"rq1_contrasts", "rq1_mixed_models", "rq1_pooled", "rq1_significance_counts"}
    for name, table in stage.items():
        pd.testing.assert_frame_equal(read_table(tmp_path / "out" / f"{name}.csv"), read_table_like(table, tmp_path))
    assert {"net_composite", "net_f0_median_st"} <= set(stage["rq1_mixed_models"]["measure"])


def read_table_like(table: pd.DataFrame, tmp_path) -> pd.DataFrame:
    """`table` as written and read back (the CSV round trip the command's output went through)."""
    from voicebias.io import read_table, write_table

    write_table(tmp_path / "expected.csv", table)
    return read_table(tmp_path / "expected.csv")


def test_analyze_rejects_a_table_without_contract_columns(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"foo": [1]}).to_csv(bad, index=False)
    with pytest.raises(SystemExit) as exc:
        cli.main(["analyze", "describe", str(bad)])
    assert exc.value.code == 1
    assert "missing contract columns" in capsys.readouterr().err


def test_preflight_explains_the_phonation_and_judge_setup_of_the_paper_profile(tmp_path, monkeypatch):
    from voicebias.cli.preflight import preflight

    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    checks = preflight(resolve_profile("paper"), root=tmp_path)
    vqvc = [c for c in checks if c.component == "phonation:vqvc"]
    assert vqvc and not all(c.ok for c in vqvc)
    assert any("VQVC" in c.detail for c in vqvc if not c.ok)
    judge = [c for c in checks if c.component == "sc_judge:gemini"]
    assert judge and not judge[0].ok and "GEMINI_API_KEY" in judge[0].detail
    assert {c.component for c in checks} >= {"system:spiritlm_base", "system:vae_gslm", "system:speechgpt"}
    embedded = preflight(resolve_profile("embedded"), root=config.ROOT)
    assert [c.ok for c in embedded if c.component.startswith(("phonation:", "sc_judge:"))] == [True, True]


def test_ui_prints_the_address_that_opens_the_runs_table(tmp_path, monkeypatch, capsys):
    from voicebias import config
    from voicebias.cli import main

    marker = tmp_path / "pipeline_state.json"
    (tmp_path / "last_run.json").write_text(json.dumps({"ui_path": "#/experiments/7?workflowType=machine_learning"}))
    monkeypatch.setattr(config, "TRACKING_MARKER", marker)
    assert main(["ui", "--port", "5123"]) == 0
    out = capsys.readouterr().out
    assert "--host 127.0.0.1 --port 5123" in out
    assert out.startswith("MLFLOW_DISABLE_TELEMETRY=true mlflow ui ")  # as the tests' environment sets it
    assert "http://127.0.0.1:5123/#/experiments/7?workflowType=machine_learning" in out
