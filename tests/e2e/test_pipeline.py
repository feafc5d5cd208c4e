"""End to end: `dvc repro` on a reduced bank in a scratch clone of this repository.

Checks what users rely on: the pipeline runs offline and leaves reports and MLflow
runs; a run with another processor's kernels reproduces every output of the reference
(written on the machine that committed it) byte for byte; a second
repro skips every stage; an experiment on one reference system's parameters re-runs only
that system's stages (plus the cross-system analysis) and moves only its metrics; a clone
restores every tracked output byte for byte with `dvc pull`; broken input stops the stage
with a readable message.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from tests.support.workspace import PASSAGES_PER_CELL, SC_PROMPTS, sh, tree_hashes  # noqa: E402

#: `dvc status --json` of an up-to-date workspace: pending_calls reads the untracked ledgers of
#: failed calls on every run (always_changed), so DVC lists it even when nothing is pending
ALWAYS_RUNS = {"pending_calls": ["always changed"]}


def test_repro_leaves_reports_and_mlflow_runs(workspace):
    _, repo, _ = workspace
    html = (repo / "reports" / "report" / "report.html").read_text(encoding="utf-8")
    assert "Carrier gate" in html and "<img" in html
    odds = pd.read_csv(repo / "reports" / "analysis" / "describe_odds_ratios.csv")
    assert set(odds["system"]) == {"voice_faithful", "content_driven", "mixed", "drifting"}
    manifest = pd.read_csv(repo / "data" / "stimuli" / "manifest.csv")
    assert len(manifest) == 3 * 3 * PASSAGES_PER_CELL * 2
    marker = json.loads((repo / "mlruns" / "pipeline_state.json").read_text())
    run = json.loads((repo / "mlruns" / "last_run.json").read_text())
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{repo / 'mlruns' / 'mlflow.db'}")
    parent = client.get_run(run["parent_run_id"])
    assert parent.data.tags["voicebias.pipeline_state"] == marker["pipeline_state"]
    assert client.get_experiment(run["experiment_id"]).tags["mlflow.experimentKind"] == "custom_model_development"
    children = client.search_runs(
        [run["experiment_id"]], f"tags.mlflow.parentRunId = '{run['parent_run_id']}'", max_results=1000
    )
    assert len(children) == len(run["children"]) == len(marker["children"]) > 0
    assert sorted(c.info.run_name for c in children) == marker["children"]
    assert {c.data.tags["system"] for c in children} == {
        "voice_faithful",
        "content_driven",
        "mixed",
        "drifting",
        "continuation_reference",
        "phonation:parametric",
    }
    # the speech-continuation study: every prompt x voice in four phonation conditions,
    # the manipulation check passed, continuations scored, the SC paper's Table 2 rendered
    phon = pd.read_csv(repo / "data" / "phonation" / "manifest.csv")
    assert len(phon) == SC_PROMPTS * 6 * 4 and set(phon["phonation"]) == {"modal", "breathy", "creaky", "endcreak"}
    assert json.loads((repo / "reports" / "phonation" / "check_metrics.json").read_text())["passed"] is True
    scored = pd.read_csv(repo / "data" / "sc_scored" / "continuation_reference.csv")
    assert len(scored) == len(phon) and (scored["status"] == "ok").all()
    assert "Speaker similarity (SC Table 2)" in html and "Judge scores (SC Fig. 2)" in html
    cont = [c for c in children if c.data.tags["task"] == "continue"]
    assert len(cont) == 1 and 0 < cont[0].data.metrics["success_rate"] <= 1


def test_the_reduced_profile_reproduces_the_committed_outputs_byte_for_byte_with_another_processors_kernels(
    workspace,
):
    """The workspace's `dvc repro` ran from empty caches with the kernels another processor would
    choose (OpenBLAS's core type, PyTorch's and numba's instruction sets): every byte it wrote,
    measures, embeddings, fits and all, equals the reference hashes that a plain run on the
    machine that committed them wrote (tests/fixtures/reduced_profile.sha256)."""
    import os

    from tests.support.workspace import REFERENCE, output_hashes, played_machine, read_reference
    from voicebias.codepaths import cpu_flags

    _, repo, res = workspace
    played = played_machine()
    assert os.environ.get("VOICEBIAS_CODE_PATHS", "avx2") == "avx2"
    if "avx2" in cpu_flags():
        assert played["OPENBLAS_CORETYPE"] in ("SkylakeX", "Sandybridge")
    # every stage ran, and what it wrote equals the reference
    n_stages = len(sh("dvc stage list --name-only", repo).stdout.split())
    assert res.stdout.count("Running stage") == n_stages
    reference, written = read_reference(), output_hashes(repo)
    regenerate = f" (a change meant: `python -m tests.support.workspace --write-reference`, commit {REFERENCE.name})"
    assert sorted(written) == sorted(reference), (
        f"outputs missing: {sorted(set(reference) - set(written))[:10]}; "
        f"outputs not in the reference: {sorted(set(written) - set(reference))[:10]}{regenerate}"
    )
    differ = sorted(k for k in reference if written[k] != reference[k])
    assert not differ, f"{len(differ)} of {len(reference)} outputs differ from the reference: {differ[:20]}{regenerate}"
    # the MLflow store holds the parent and every child run of this pipeline state
    from mlflow.tracking import MlflowClient

    marker = json.loads((repo / "mlruns" / "pipeline_state.json").read_text())
    client = MlflowClient(f"sqlite:///{repo / 'mlruns' / 'mlflow.db'}")
    exp = client.get_experiment_by_name(marker["experiment"])
    parents = client.search_runs([exp.experiment_id], "tags.`voicebias.level` = 'pipeline'")
    assert len(parents) == 1 and parents[0].data.tags["voicebias.pipeline_state"] == marker["pipeline_state"]
    kids = client.search_runs(
        [exp.experiment_id], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'", max_results=1000
    )
    assert sorted(k.info.run_name for k in kids) == marker["children"] and len(kids) > 20
    # tracking the same state again adds no run, and changes no tracked file
    sh("dvc repro --force --single-item tracking", repo)
    assert len(client.search_runs([exp.experiment_id], "tags.`voicebias.level` = 'pipeline'")) == 1
    assert sh("git status --porcelain", repo).stdout == ""


def test_second_repro_skips_every_stage(workspace):
    _, repo, _ = workspace
    res = sh("dvc repro", repo)
    ran = [line.split("'")[1] for line in res.stdout.splitlines() if line.startswith("Running stage")]
    assert ran == ["pending_calls"], ran  # it reads the untracked ledgers of failed calls: none here
    n_stages = len(sh("dvc stage list --name-only", repo).stdout.split())
    assert res.stdout.count("didn't change, skipping") == n_stages - 1
    assert sh("git status --porcelain", repo).stdout == ""


def test_fresh_clone_pulls_identical_outputs(workspace):
    base, repo, _ = workspace
    sh("dvc push", repo)
    assert (base / "voicebias-dvc-storage").is_dir()
    clone = base / "clone"
    sh(f"git clone -q {repo} {clone}", base)
    # the clone sits beside the original, so the default remote resolves to the same storage
    sh("dvc pull", clone)
    shared = (
        "data/stimuli",
        "data/responses",
        "data/scored",
        "data/measures",
        "data/phonation",
        "data/continuations",
        "data/sc_scored",
    )
    original = {k: v for sub in shared for k, v in tree_hashes(repo, sub).items()}
    pulled = {k: v for sub in shared for k, v in tree_hashes(clone, sub).items()}
    assert any(k.startswith("data/phonation/audio/") for k in original)
    assert any(k.startswith("data/continuations/") and k.endswith(".flac") for k in original)
    assert len(original) > 500 and pulled == original
    # the pulled outputs match dvc.lock; only the MLflow store is local, so repro logs the
    # pulled evidence there and runs nothing else
    status = json.loads(sh("dvc status --json", clone).stdout)
    assert set(status) == {"tracking", *ALWAYS_RUNS}, status
    res = sh("dvc repro", clone)
    ran = {line.split("'")[1] for line in res.stdout.splitlines() if line.startswith("Running stage")}
    assert ran == {"tracking", *ALWAYS_RUNS}
    assert json.loads(sh("dvc status --json", clone).stdout) == ALWAYS_RUNS


@pytest.mark.parametrize(
    "section, key, value, expected",
    [
        ("mixed", "content_wieght", 0.9, "systems.mixed.content_wieght: unknown key; did you mean content_weight?"),
        ("voice_faithful", "error_rate", "high", "systems.voice_faithful.error_rate: expected a number, got 'high'"),
        (  # a key typed into an address: refused, and repeated nowhere
            "gpt_audio",
            "base_url",
            "https://lab:sk-proj-PLANTED0123456789abcdef@api.example.org/v1",
            "systems.gpt_audio.base_url: holds credentials before the host",
        ),
    ],
)
def test_a_bad_param_stops_dvc_repro_before_any_stage_runs(workspace, section, key, value, expected):
    _, repo, _ = workspace
    path = repo / "params.yaml"
    original = path.read_text(encoding="utf-8")
    params = yaml.safe_load(original)
    params["systems"].setdefault(section, {})[key] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")
    try:
        res = sh("dvc repro", repo, check=False)
        assert res.returncode != 0
        assert expected in res.stderr and "Traceback" not in res.stderr
        assert "PLANTED" not in res.stdout + res.stderr + (repo / "dvc.lock").read_text(encoding="utf-8")
        ran = [line.split("'")[1] for line in res.stdout.splitlines() if line.startswith("Running stage")]
        assert ran == ["params"], ran
        assert sh("git status --porcelain -- data reports dvc.lock", repo).stdout == ""
    finally:
        path.write_text(original, encoding="utf-8")


def test_broken_bank_stops_the_pipeline_with_a_readable_message(workspace):
    _, repo, _ = workspace
    path = repo / "data" / "bank" / "en.yaml"
    original = path.read_text(encoding="utf-8")
    entries = yaml.safe_load(original)
    entries[0]["text"] = entries[0]["text"] + " My husband agreed."
    path.write_text(yaml.safe_dump(entries, allow_unicode=True, sort_keys=False), encoding="utf-8")
    try:
        res = sh("dvc repro bank", repo, check=False)
        assert res.returncode != 0
        assert "suite 'passages'" in res.stderr and "expect_column_values_to_not_match_regex" in res.stderr
        assert "Traceback" not in res.stderr
    finally:
        # DVC removed the stage's outputs before running it: put them back for the next test
        path.write_text(original, encoding="utf-8")
        sh("git checkout -- reports/bank && dvc checkout -q bank", repo)
    assert "up to date" in sh("dvc status bank", repo).stdout


def test_an_experiment_on_one_system_reruns_only_that_system_and_moves_only_its_metrics(workspace):
    """`dvc exp run` with two of voice_faithful's parameters changed: only that system's stages (and
    the cross-system analysis) are stale and run, only its metrics move, and with no planted error its
    describe answers are perfectly separated by the voice, which the analysis reports instead of a
    number."""
    _, repo, _ = workspace
    path = repo / "params.yaml"
    text = path.read_text(encoding="utf-8")
    old = "  voice_faithful:\n    rule: voice\n    error_rate: 0.05\n    noncompliance_rate: 0.02\n"
    assert old in text, "the voice_faithful section of params.yaml changed"
    planted_voice = "voice_error_rates: {es+Annie: 0.4}"
    assert planted_voice in text, "the planted voice of voice_faithful changed"
    text = text.replace(planted_voice, "voice_error_rates: {}")
    path.write_text(text.replace(old, old.replace("0.05", "0.0").replace("0.02", "0.0")), encoding="utf-8")
    status = json.loads(sh("dvc status --json", repo).stdout)
    # the params check re-runs on any change; its record is unchanged, so only the readers of the change
    # follow: the system's respond stages (the analysis reads what respond records, the planted truth
    # included), its whole-run replicates and the psychometric stage, which reads every system's
    # planted function
    assert set(status) - set(ALWAYS_RUNS) == {
        "respond@voice_faithful",
        "continuum_respond@voice_faithful",
        "replicates@voice_faithful",
        "psychometric",
        "params",
    }
    res = sh("dvc exp run", repo)
    ran = {line.split("'")[1] for line in res.stdout.splitlines() if line.startswith("Running stage")}
    assert not any(name in s for s in ran for name in ("content_driven", "mixed", "drifting")), ran
    assert {"respond@voice_faithful", "scoring@voice_faithful", "analysis"} <= ran
    diff = json.loads(sh("dvc metrics diff --json", repo).stdout)
    keys = [k for path in diff.values() for k in path]
    assert keys and all(k.startswith("voice_faithful.") for k in keys), keys
    odds = pd.read_csv(repo / "reports" / "analysis" / "describe_odds_ratios.csv")
    row = odds[(odds["system"] == "voice_faithful") & (odds["lang"] == "ALL")].iloc[0]
    assert row["fit_status"] == "perfect separation (complete)" and pd.isna(row["odds_ratio"])


def test_reduced_profile_recovers_every_planted_value(workspace):
    """Planted vs recovered, both studies, on the reduced profile as `dvc repro` left it (tag
    'repro', before later tests change params), so a wiring error between stages fails here.

    Every row's flags must agree with its own numbers: a simultaneous interval nests its row's own
    95 % interval, and its flag says whether the planted value lies in either. A 95 % interval
    misses its planted value 5 % of the time even when every stage is right (this reduced profile's
    male passive rate is 5 of 9 against a planted 0.2, P(X >= 5) = 0.02, outside even its
    simultaneous interval), so the test asks of every row that the planted value lies within twice
    its own interval's half-widths (on the log scale for odds ratios; a miss by chance has
    probability about 1e-4 per row), and of the values outside their own 95 % interval that they be
    no more than a Binomial(rows, .05) count reaches with probability .999. Describe odds ratios
    that the ML fit cannot estimate (separation, reported as such) are checked on the Firth interval
    of describe_odds_ratios.csv instead. SC retention must be within its documented
    RETENTION_TOLERANCE, exactly as its recovered_ok flag says; a passive rate is recovered
    exactly when its simultaneous interval holds it.
    """
    import io

    import numpy as np
    from scipy import stats

    from voicebias.analysis.sc import RETENTION_TOLERANCE

    _, repo, _ = workspace

    def at_repro(path: str) -> pd.DataFrame:
        return pd.read_csv(io.StringIO(sh(f"git show repro:{path}", repo).stdout))

    def within_twice(planted: float, rec: float, lo: float, hi: float, log: bool = False) -> bool:
        f = np.log if log else (lambda x: x)
        p, r, a, b = f(planted), f(rec), f(lo), f(hi)
        return bool(r - 2 * (r - a) - 1e-12 <= p <= r + 2 * (b - r) + 1e-12)

    pvr = at_repro("reports/analysis/planted_vs_recovered.csv")
    odds = at_repro("reports/analysis/describe_odds_ratios.csv")
    systems = {"voice_faithful", "content_driven", "mixed", "drifting"}
    assert set(pvr["system"]) == systems
    expected = {
        "odds_ratio_per_step",
        "misgender_rate_aligned",
        "misgender_rate_neutral",
        "misgender_rate_misaligned",
        "rq1_f0_shift_st",
        *[f"rq1_f0_stereotype_effect_st_readback_{lang}" for lang in ("en", "es", "zh")],
    }
    for s in systems:
        have = set(pvr.loc[pvr["system"] == s, "quantity"])
        assert expected <= have, (s, expected - have)
    assert "content_weight" in set(pvr.loc[pvr["system"] == "mixed", "quantity"])
    assert pvr["planted"].notna().all()
    misses, checked = [], 0

    def simultaneous_agrees(r) -> None:
        """A row in its table's family: its simultaneous interval nests its own, and its flag says
        whether the planted value lies in either."""
        if pd.isna(r.simultaneous_confidence):
            assert pd.isna(r.planted_in_simultaneous_ci), r
            return
        assert r.simultaneous_confidence > 0.95, r
        lo, hi = r.simultaneous_ci_low, r.simultaneous_ci_high
        bounded = bool(np.isfinite(lo) and np.isfinite(hi))
        if bounded:
            assert lo <= r.ci_low + 1e-12 and r.ci_high <= hi + 1e-12, r
        own = bool(r.ci_low <= r.planted <= r.ci_high)
        assert str(r.planted_in_simultaneous_ci) == str(own or (bounded and lo <= r.planted <= hi)), r

    for r in pvr.itertuples():
        has_ci = bool(np.isfinite(r.ci_low) and np.isfinite(r.ci_high))
        flag = None if pd.isna(r.planted_in_ci) else str(r.planted_in_ci) == "True"
        if r.quantity == "odds_ratio_per_step" and str(r.fit_status).startswith("perfect separation"):
            assert flag is None and not has_ci, r
            f = odds[(odds["system"] == r.system) & (odds["lang"] == "ALL")].iloc[0]
            assert within_twice(r.planted, f["firth_odds_ratio"], f["firth_ci_low"], f["firth_ci_high"], log=True), r
            checked += 1
            if not f["firth_ci_low"] <= r.planted <= f["firth_ci_high"]:
                misses.append((r.system, r.quantity))
            continue
        if r.quantity == "odds_ratio_per_step_mixed" and r.fit_status != "ok":
            # the mixed model says why it has no estimate (separation, or a passage SD the Laplace
            # approximation sends off on near-separated answers); the paper's fit above stands
            assert flag is None and not has_ci, r
            assert "separation" in r.fit_status or "diverged" in r.fit_status, r
            continue
        assert has_ci and np.isfinite(r.recovered) and flag is not None, r
        assert flag == bool(r.ci_low <= r.planted <= r.ci_high), r
        simultaneous_agrees(r)
        tol = getattr(r, "tolerance", np.nan)
        if np.isfinite(tol):
            # an acoustic quantity: recovered within the instrument's documented accuracy
            # (the reference voices are deterministic, so its CI can be narrower than that)
            assert abs(r.recovered - r.planted) <= tol and str(r.within_tolerance) == "True", r
        else:
            is_or = r.quantity.startswith("odds_ratio_per_step")
            assert within_twice(r.planted, r.recovered, r.ci_low, r.ci_high, log=is_or), r
        checked += 1
        if not flag and not np.isfinite(tol):
            misses.append((r.system, r.quantity))
    # the drifting system's F0 shift is found with the right sign; the fixed voices' CIs hold 0
    drift = pvr[(pvr["system"] == "drifting") & (pvr["quantity"] == "rq1_f0_shift_st")].iloc[0]
    assert drift["planted"] == 2.0 and drift["ci_low"] > 0

    sc = at_repro("reports/sc/planted_vs_recovered.csv")
    assert {"retention_h1_h2_db_male", "retention_h1_h2_db_female", "passive_rate_male", "passive_rate_female"} <= set(
        sc.loc[sc["system"] == "continuation_reference", "quantity"]
    )
    for r in sc[sc["planted"].notna()].itertuples():
        ok = str(r.recovered_ok) == "True"
        if r.quantity.startswith("retention_"):
            assert ok == bool(abs(r.recovered - r.planted) <= RETENTION_TOLERANCE) and ok, r
        else:
            assert str(r.planted_in_ci) == str(bool(r.ci_low <= r.planted <= r.ci_high)), r
            simultaneous_agrees(r)
            assert ok == (str(r.planted_in_simultaneous_ci) == "True"), r
            assert within_twice(r.planted, r.recovered, r.ci_low, r.ci_high), r
            checked += 1
            if str(r.planted_in_ci) != "True":
                misses.append((r.system, r.quantity))
    allowed = int(stats.binom.ppf(0.999, checked, 0.05))
    assert len(misses) <= allowed, (misses, checked, allowed)
