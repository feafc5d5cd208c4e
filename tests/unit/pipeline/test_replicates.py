"""Whole-run replicates (run.replicates): the stage re-runs the chosen tasks under new seeds, and each
cell's spread over the runs recovers the run-to-run noise a reference system plants.

The planted noise: a reference system draws each describe answer from its own seeded stream, calling
a voice by the other gender with probability `error_rate` (no non-compliance here). Under a new seed
every answer is drawn again, so a cell of n items has a misgender rate whose run-to-run SD is
sqrt(e (1 - e) / n), the binomial SD of a mean of n independent draws.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.fakes.stimuli import make_stimuli
from tests.unit.report.test_card import CHECK, GATE, PROV, make_analysis
from voicebias import config
from voicebias.analysis.replicates import CELL_COLUMNS, SPREAD_COLUMNS, cell_estimates, spread
from voicebias.analysis.status import NOT_ESTIMABLE
from voicebias.errors import VoicebiasError
from voicebias.io import read_json, read_table
from voicebias.params import replicate_tasks, validate_params
from voicebias.pipeline import replicates as stage
from voicebias.pipeline.respond import run_stage as respond
from voicebias.pipeline.scoring import run_stage as scoring
from voicebias.report.card import audit_card, card_tables, render_card_md, with_item_intervals
from voicebias.systems.base import replicate_seed

SYSTEM = "voice_faithful"
ERROR_RATE = 0.3


def _params(replicates: int, tasks: list[str] | None = None) -> dict:
    raw = yaml.safe_load((config.PROFILES_DIR / "embedded.yaml").read_text(encoding="utf-8"))
    raw["run"].update(
        {
            "systems": [SYSTEM],
            "sc_systems": [],
            "samples_per_item": 1,
            "determinism_probe": 0,
            "replicates": replicates,
            "replicate_tasks": tasks if tasks is not None else ["describe"],
        }
    )
    raw["systems"] = {SYSTEM: {"rule": "voice", "error_rate": ERROR_RATE, "noncompliance_rate": 0.0}}
    return validate_params(raw)


def _project(root: Path, n: int) -> pd.DataFrame:
    """n one-second stimuli (make_stimuli: poles in turn, genders in threes), their passages, the carrier
    gate passed."""
    stim = make_stimuli(root, n, seconds=1.0)
    stim.to_csv(root / "data" / "stimuli" / "manifest.csv", index=False)
    (root / "data" / "passages").mkdir(parents=True)
    pd.DataFrame({"passage_id": stim["passage_id"], "text": "A day at work.", "gloss_en": "A day at work."}).to_csv(
        root / "data" / "passages" / "passages.csv", index=False
    )
    (root / "reports" / "carrier_gate").mkdir(parents=True)
    (root / "reports" / "carrier_gate" / "metrics.json").write_text('{"passed": true}')
    return stim


def _run(root: Path, params: dict) -> pd.DataFrame:
    """Run 0 (respond and scoring on describe), then the replicates stage, all in this process."""
    respond(
        params,
        system=SYSTEM,
        manifest_path=root / "data" / "stimuli" / "manifest.csv",
        passages_path=root / "data" / "passages" / "passages.csv",
        gate_metrics=root / "reports" / "carrier_gate" / "metrics.json",
        responses_dir_for=lambda t: root / "data" / "responses" / SYSTEM / t,
        report_for=lambda t: root / "reports" / "respond" / SYSTEM / f"{t}.json",
        planted_truth_path=root / "reports" / "respond" / SYSTEM / "planted_truth.json",
        cache_dir=root / ".cache" / "responses",
        root=root,
        render_cache=root / ".cache" / "renders",
        task_names=["describe"],
    )
    scoring(
        system=SYSTEM,
        tasks=["describe"],
        responses_root=root / "data" / "responses",
        out_path=root / "data" / "scored" / f"{SYSTEM}.csv",
    )
    return stage.run_stage(
        params,
        system=SYSTEM,
        manifest_path=root / "data" / "stimuli" / "manifest.csv",
        passages_path=root / "data" / "passages" / "passages.csv",
        gate_metrics=root / "reports" / "carrier_gate" / "metrics.json",
        scored_path=root / "data" / "scored" / f"{SYSTEM}.csv",
        acoustic_path=root / "data" / "scored" / f"{SYSTEM}_acoustics.csv",
        inputs_path=root / "data" / "measures" / "inputs.csv",
        reference_path=root / "data" / "measures" / "composite_reference.csv",
        data_dir=root / "data" / "replicates" / SYSTEM,
        cache_dir=root / ".cache" / "responses",
        measure_cache=root / ".cache" / "measures",
        root=root,
        out_dir=root / "reports" / "replicates" / SYSTEM,
        render_cache=root / ".cache" / "renders",
    )


def _logged(root: Path) -> dict[str, tuple[int, int]]:
    """{replicate: (calls, cache hits)} of the replicates' last entries in the run log."""
    out = {}
    for line in (root.parent / "runs.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry["stage"].startswith(f"replicates@{SYSTEM}-"):
            out[entry["stage"].split("-")[-1]] = (entry["calls"], entry["cache_hits"])
    return out


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    import voicebias.runlog

    monkeypatch.setattr(voicebias.runlog, "RUN_LOG", tmp_path / "runs.jsonl")
    return tmp_path / "proj"


def test_the_spread_over_replicates_recovers_the_planted_run_to_run_sd(scratch):
    """36 items (6 per voice gender x pole), 200 runs (an SD over 200 runs has a relative standard
    error of about 5 %): each cell's SD over the runs is within 20 % of sqrt(e (1 - e) / n); the
    card shows the cells with their runs' min, median, max, SD and CV."""
    runs = 200
    _project(scratch, 36)
    out = _run(scratch, _params(runs))
    pooled = out[(out["lang"] == "ALL") & (out["metric"] == "misgender_rate")]
    assert len(pooled) == 6 + 3  # voice gender x pole, and the three cell types over both voices
    assert (pooled["replicates"] == runs).all() and (pooled["status"] == "ok").all()
    planted = np.sqrt(ERROR_RATE * (1 - ERROR_RATE) / pooled["n"].to_numpy(float))
    ratio = pooled["sd"].to_numpy(float) / planted
    assert np.all(np.abs(ratio - 1) <= 0.20), dict(zip(pooled["condition"] + "/" + pooled["voice_gender"], ratio))
    # the runs' mean is the planted rate; the CV is the SD over that mean
    assert np.allclose(pooled["mean"], ERROR_RATE, atol=0.05)
    assert np.allclose(pooled["cv"], pooled["sd"] / pooled["mean"])
    # every run sent its own requests: 36 per replicate, none failed
    metrics = read_json(scratch / "reports" / "replicates" / SYSTEM / "metrics.json")[SYSTEM]
    assert metrics["runs"] == runs and sorted(metrics["calls"]) == sorted(f"r{r}" for r in range(1, runs))
    assert all(c == {"describe": {"requests": 36, "failed": 0}} for c in metrics["calls"].values())
    assert metrics["spread"]["describe"]["misgender_rate"]["cells"] == 9
    cells = read_table(scratch / "reports" / "replicates" / SYSTEM / "cells.csv")
    assert list(cells.columns) == CELL_COLUMNS and set(cells["replicate"]) == set(range(runs))
    # the card: the three cell types, this run's estimate beside the runs' spread
    card = audit_card(
        make_analysis(scratch / "analysis"), None, GATE, CHECK, PROV, replicates=with_item_intervals(out, None)
    )
    assert "How much each result moves from run to run" in render_card_md(card)
    rows = card_tables(card)["card_replicates"]
    assert list(rows["cell"]) == [f"misgender_rate: {c}" for c in ("aligned", "misaligned", "neutral")]
    assert [e["replicates"] for e in card["replicates"]] == [runs] * 3
    assert rows["runs"].tolist() == [str(runs)] * 3
    lo, med, hi = (float(x) for x in rows["min / median / max"].iloc[0].split(" / "))
    assert lo <= med <= hi and lo < hi


def test_a_second_run_of_the_stage_sends_nothing_and_writes_the_same_bytes(scratch):
    _project(scratch, 12)
    params = _params(3)
    _run(scratch, params)
    first = {p.name: p.read_bytes() for p in (scratch / "reports" / "replicates" / SYSTEM).iterdir()}
    answers = sorted((scratch / "data" / "replicates" / SYSTEM).rglob("*.flac"))
    assert len(answers) == 2 * 12  # replicates 1 and 2; run 0 is the respond stage's
    assert _logged(scratch) == {"r1": (12, 0), "r2": (12, 0)}
    shutil.rmtree(scratch / "data" / "replicates")  # DVC clears a stage's outputs before it runs
    stage_out = _run(scratch, params)
    assert _logged(scratch) == {"r1": (0, 12), "r2": (0, 12)}  # every replicate answered from the cache
    assert {p.name: p.read_bytes() for p in (scratch / "reports" / "replicates" / SYSTEM).iterdir()} == first
    assert len(stage_out) and (stage_out["replicates"] == 3).all()


def test_replicates_draw_new_answers_and_run_0_is_the_run_itself(scratch):
    _project(scratch, 12)
    _run(scratch, _params(2))
    run0 = read_table(scratch / "data" / "responses" / SYSTEM / "describe" / "responses.csv")
    run1 = read_table(scratch / "data" / "replicates" / SYSTEM / "r1" / "describe" / "responses.csv")
    assert list(run0["stimulus_id"]) == list(run1["stimulus_id"])
    assert set(run0["cache_key"]).isdisjoint(run1["cache_key"])  # a new seed: new requests
    cells = read_table(scratch / "reports" / "replicates" / SYSTEM / "cells.csv")
    scored = read_table(scratch / "data" / "scored" / f"{SYSTEM}.csv")
    from voicebias.analysis.disaggregated import s2s_items

    want = cell_estimates(s2s_items(scored, None))
    got = cells[cells["replicate"] == 0].drop(columns="replicate").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want.reset_index(drop=True), check_dtype=False)


def test_without_replicates_nothing_is_sent_and_the_tables_have_their_columns(scratch):
    _project(scratch, 6)
    out = _run(scratch, _params(1))
    assert out.empty and list(out.columns) == SPREAD_COLUMNS
    assert (scratch / "data" / "replicates" / SYSTEM).is_dir()
    assert not any((scratch / "data" / "replicates" / SYSTEM).iterdir())
    assert read_json(scratch / "reports" / "replicates" / SYSTEM / "metrics.json") == {
        SYSTEM: {"runs": 1, "tasks": [], "calls": {}, "spread": {}}
    }


def test_spread_is_the_min_median_max_sd_and_cv_of_the_runs_and_the_card_gets_run_0s_interval():
    keys = {
        "study": "s2s",
        "system": "a",
        "task": "readback",
        "lang": "ALL",
        "voice_gender": "female",
        "condition_factor": "content_pole",
        "metric": "delta_composite",
    }
    est = [0.5, -0.25, 1.0, 0.0, 2.0]
    cells = pd.DataFrame(
        [{"replicate": r, **keys, "condition": "neutral", "n": 10, "estimate": e} for r, e in enumerate(est)]
        + [{"replicate": 0, **keys, "condition": "feminine", "n": 10, "estimate": 0.0}]
        + [{"replicate": r, **keys, "condition": "masculine", "n": 10, "estimate": e} for r, e in enumerate([1, -1])]
    )
    dis = pd.DataFrame([{**keys, "condition": "neutral", "ci_low": 0.1, "ci_high": 0.9}])
    out = with_item_intervals(spread(cells), dis).set_index("condition")
    neutral = out.loc["neutral"]
    assert neutral["replicates"] == 5 and neutral["estimate"] == 0.5 and neutral["n"] == 10
    assert (neutral["min"], neutral["median"], neutral["max"]) == (-0.25, 0.5, 2.0)
    assert neutral["mean"] == pytest.approx(np.mean(est))
    assert neutral["sd"] == pytest.approx(np.std(est, ddof=1))
    assert neutral["cv"] == pytest.approx(np.std(est, ddof=1) / np.mean(est))
    assert (neutral["ci_low"], neutral["ci_high"]) == (0.1, 0.9)
    # one run: no SD, said so; a mean of 0: an SD but no CV
    one = out.loc["feminine"]
    assert one["status"] == NOT_ESTIMABLE and one["reason"] == "estimated in fewer than 2 runs"
    assert math.isnan(one["sd"]) and math.isnan(one["ci_low"])
    zero = out.loc["masculine"]
    assert zero["sd"] == pytest.approx(math.sqrt(2)) and math.isnan(zero["cv"]) and zero["status"] == "ok"


def test_replicate_seeds_are_new_per_replicate_and_replicate_0_is_the_run():
    assert replicate_seed(123, 0) == 123
    seeds = [replicate_seed(123, r) for r in range(1, 50)]
    assert len(set(seeds)) == 49 and 123 not in seeds
    with pytest.raises(ValueError, match="integer >= 0"):
        replicate_seed(123, -1)


def test_params_refuse_a_replicated_task_the_run_does_not_run_and_fewer_than_one_run():
    assert replicate_tasks(_params(1)) == []
    assert replicate_tasks(_params(4, [])) == list(_params(4)["tasks"]["names"])
    with pytest.raises(VoicebiasError, match=r"run.replicate_tasks names translate, not in tasks.names"):
        raw = json.loads(json.dumps(_params(3, ["translate"])))
        raw["tasks"]["names"] = ["describe"]
        validate_params(raw)
    with pytest.raises(VoicebiasError, match=r"run.replicates"):
        raw = json.loads(json.dumps(_params(3)))
        raw["run"]["replicates"] = 0
        validate_params(raw)


def test_the_replicates_tables_are_checked_at_once_a_stimulus_unique_within_each_replicate(scratch):
    """The responses gate over the stacked replicate tables: a stimulus once per replicate passes, a
    stimulus twice in one replicate fails, as it fails in one table."""
    from voicebias.systems.runner import validate_responses
    from voicebias.validation import ValidationFailed

    _project(scratch, 6)
    _run(scratch, _params(3))
    tables = [
        read_table(scratch / "data" / "replicates" / SYSTEM / f"r{r}" / "describe" / "responses.csv").assign(
            replicate=r
        )
        for r in (1, 2)
    ]
    validate_responses(pd.concat(tables, ignore_index=True), "s2s", ("replicate",))
    twice = pd.concat([tables[0], tables[0].iloc[:1], tables[1]], ignore_index=True)
    with pytest.raises(ValidationFailed, match="stimulus_id"):
        validate_responses(twice, "s2s", ("replicate",))


def test_a_stages_task_tables_are_checked_at_once_a_stimulus_unique_within_each_task(scratch):
    """The respond stages check every task's table in one gate: the same stimuli in two tasks
    pass, a stimulus twice within one task fails, as it fails in one table."""
    from voicebias.systems.runner import validate_responses
    from voicebias.validation import ValidationFailed

    _project(scratch, 6)
    _run(scratch, _params(1))
    describe = read_table(scratch / "data" / "responses" / SYSTEM / "describe" / "responses.csv")
    summarize = describe.assign(task="summarize")
    validate_responses(pd.concat([describe, summarize], ignore_index=True), "s2s", ("task",))
    twice = pd.concat([describe, summarize, summarize.iloc[:1]], ignore_index=True)
    with pytest.raises(ValidationFailed, match="stimulus_id"):
        validate_responses(twice, "s2s", ("task",))
