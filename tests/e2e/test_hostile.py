"""End to end: a system that misbehaves as real ones do (models/cards/hostile.yaml) added to the
reproduced reduced profile. The pipeline runs to the report; every planted fault is a counted
exclusion with its own reason in responses.csv, the scored tables, the audit card and MLflow;
the verdicts on what remains are the planted ones; the other systems' outputs do not move."""

from __future__ import annotations

import io
import json

import pandas as pd

from tests.support.workspace import output_hashes, sh
from voicebias.analysis.exclusions import planted_fault_of
from voicebias.systems.reference import FAULT_REASONS

OTHERS = ("voice_faithful", "content_driven", "mixed", "drifting")
TASKS = ("readback", "paraphrase", "summarize", "translate", "describe")


def responses(clone) -> pd.DataFrame:
    return pd.concat(
        [pd.read_csv(clone / "data" / "responses" / "hostile" / t / "responses.csv") for t in TASKS], ignore_index=True
    )


def planted_counts(table: pd.DataFrame) -> dict[str, int]:
    """Reason -> count of the faults the system wrote into its replies' provenance (read here, not by the audit)."""
    faults = table["provenance"].map(planted_fault_of).dropna()
    return faults.map(FAULT_REASONS).value_counts().sort_index().to_dict()


def test_the_pipeline_runs_to_the_report_and_only_the_new_system_runs(hostile):
    clone, res, _ = hostile
    assert res.returncode == 0, res.stderr[-3000:]
    ran = {line.split("'")[1] for line in res.stdout.splitlines() if line.startswith("Running stage")}
    assert {"respond@hostile", "scoring@hostile", "acoustic_scoring@hostile", "analysis", "report", "tracking"} <= ran
    assert not any(s.endswith(f"@{other}") for s in ran for other in OTHERS), ran
    assert "hostile" in (clone / "reports" / "report" / "report.html").read_text(encoding="utf-8")


def test_every_fault_is_planted_and_each_is_excluded_with_its_own_reason(hostile):
    clone, _, _ = hostile
    table = responses(clone)
    planted = planted_counts(table)
    assert set(planted) == set(FAULT_REASONS.values()), planted  # every kind of fault occurs
    faults = table["provenance"].map(planted_fault_of)
    # in responses.csv: every fault the reply itself shows is excluded there with its reason; noise
    # is not a screen's question (the acoustic measurement excludes it); well-formed replies pass
    screened = faults.notna() & (faults != "noise")
    assert (table.loc[screened, "status"] == "excluded").all()
    assert (table.loc[screened, "reason"] == faults[screened].map(FAULT_REASONS)).all()
    assert table.loc[screened, "error"].notna().all()
    assert (table.loc[faults.isna() | (faults == "noise"), "status"] == "ok").all()
    # in the scored tables
    scored = pd.read_csv(clone / "data" / "scored" / "hostile.csv")
    assert scored["status"].value_counts().to_dict() == table["status"].value_counts().to_dict()
    ac = pd.read_csv(clone / "data" / "scored" / "hostile_acoustics.csv")
    noise = table.loc[faults == "noise", "stimulus_id"] + "/" + table.loc[faults == "noise", "task"]
    ac_key = ac["stimulus_id"] + "/" + ac["task"]
    assert set(ac_key[(ac["status"] == "excluded") & (ac["reason"] == "no_voicing")]) == set(noise)
    # exclusions.csv, the card and MLflow carry the same counts, which equal the planted ones
    excluded = pd.read_csv(clone / "reports" / "analysis" / "exclusions.csv")
    mine = excluded[(excluded["system"] == "hostile") & ~excluded["reason"].isin(["call_failed", "non_compliant"])]
    assert mine.groupby("reason")["n"].sum().sort_index().to_dict() == planted
    card = json.loads((clone / "reports" / "report" / "audit_card.json").read_text(encoding="utf-8"))
    assert card["exclusions"]["s2s"]["hostile"]["excluded"] == planted
    assert card["exclusions"]["s2s"]["hostile"]["failed"] == 0
    vs = pd.read_csv(clone / "reports" / "analysis" / "planted_exclusions.csv")
    assert set(vs["system"]) == {"hostile"} and vs["recovered_ok"].astype(str).eq("True").all()
    assert dict(zip(vs["quantity"].str.removeprefix("excluded_"), vs["planted"])) == planted
    from mlflow.tracking import MlflowClient

    run = json.loads((clone / "mlruns" / "last_run.json").read_text())
    client = MlflowClient(f"sqlite:///{clone / 'mlruns' / 'mlflow.db'}")
    kids = client.search_runs(
        [run["experiment_id"]], f"tags.mlflow.parentRunId = '{run['parent_run_id']}'", max_results=1000
    )
    logged: dict[str, float] = {}
    for k in kids:
        if k.data.tags.get("system") == "hostile" and k.data.tags.get("lang") != "ALL":
            for key, v in k.data.metrics.items():
                if (
                    key.startswith("exclusions/")
                    and key != "exclusions/total"
                    and not key.endswith(("/call_failed", "/non_compliant"))
                ):
                    reason = key.rsplit("/", 1)[1]
                    logged[reason] = logged.get(reason, 0) + v
    assert {k: int(v) for k, v in sorted(logged.items())} == planted


def test_the_verdicts_on_what_remains_are_the_planted_ones(hostile):
    clone, _, _ = hostile
    card = json.loads((clone / "reports" / "report" / "audit_card.json").read_text(encoding="utf-8"))
    s2s = {e["system"]: e for e in card["s2s"]}
    h = s2s["hostile"]
    # describe: perfectly content-driven, so completely separated; the Firth fit stands in
    assert h["invariance"]["verdict"] == "content-driven", h["invariance"]
    odds = pd.read_csv(clone / "reports" / "analysis" / "describe_odds_ratios.csv")
    row = odds[(odds["system"] == "hostile") & (odds["lang"] == "ALL")].iloc[0]
    assert row["status"] == "separation" and str(row["fit_status"]).startswith("perfect separation"), row.to_dict()
    assert pd.isna(row["odds_ratio"])  # no ML estimate exists; Firth's is finite, its interval excludes 1
    assert 1 < row["firth_ci_low"] < row["firth_odds_ratio"] < row["firth_ci_high"], row.to_dict()
    # summarize: the same 'she' sentence for every item: P(she) 1 for both voices, no slope
    pron = pd.read_csv(clone / "reports" / "analysis" / "summarize_pronouns.csv")
    p = pron[pron["system"] == "hostile"].iloc[0]
    assert p["delta_pp"] == 0
    # RQ1: the well-formed replies drift by the planted 2 semitones toward the stereotype
    assert h["drift"]["verdict"] == "drifting toward the stereotype", h["drift"]
    assert abs(h["drift"]["est_min"] - 2.0) < 0.1 and abs(h["drift"]["est_max"] - 2.0) < 0.1


def test_the_other_systems_outputs_are_byte_identical(hostile):
    clone, _, before = hostile
    after = output_hashes(clone)
    for path, digest in before.items():
        if any(f"/{s}" in path for s in OTHERS) and "hostile" not in path:
            assert after.get(path) == digest, path
    # the cross-system tables: every row of another system is unchanged (rows pooled over systems,
    # system 'ALL', are not another system's)
    for sub in ("reports/analysis", "reports/disaggregated"):
        for p in sorted((clone / sub).glob("*.csv")):
            rel = str(p.relative_to(clone))
            old = sh(f"git show repro:{rel}", clone, check=False)
            if old.returncode != 0:
                continue  # a table this version adds
            was = pd.read_csv(io.StringIO(old.stdout), dtype=str, keep_default_na=False)
            now = pd.read_csv(p, dtype=str, keep_default_na=False)
            if "system" not in now.columns:
                continue
            keep = lambda df: df[df["system"].isin(OTHERS)].reset_index(drop=True)  # noqa: E731
            pd.testing.assert_frame_equal(keep(now)[list(was.columns)], keep(was), obj=rel)
