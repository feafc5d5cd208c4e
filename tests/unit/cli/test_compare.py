"""`voicebias compare`: the differences between two audit cards, on copies of the embedded
default's card with planted changes, and the resolution of its arguments (file, folder,
git revision, MLflow run id)."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from voicebias import cli
from voicebias.cli.compare import (
    ABSENT,
    CARD_ARTIFACT,
    CardNotFound,
    Difference,
    compare_cards,
    format_differences,
    resolve_card,
)

REPO = Path(__file__).resolve().parents[3]
CARD = REPO / "reports" / "report" / "audit_card.json"


@pytest.fixture(scope="module")
def base():
    """The committed card of the embedded default."""
    return json.loads(CARD.read_text(encoding="utf-8"))


def _system(card, name):
    return next(e for e in card["s2s"] if e["system"] == name)


def _write(path, card):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(card, indent=2, sort_keys=True), encoding="utf-8")
    return path


def _run(argv, capsys):
    rc = cli.main(["compare", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def planted(base):
    """The card with a verdict flip and OR change (mixed), an OR change alone (content_driven), a new
    system, another stimulus set, and float changes below the default tolerance."""
    b = copy.deepcopy(base)
    _system(b, "mixed")["invariance"].update(verdict="content-driven", odds_ratio=9.8, ci_low=3.1, ci_high=30.2)
    _system(b, "content_driven")["invariance"]["odds_ratio"] = 31.0
    _system(b, "voice_faithful")["invariance"]["odds_ratio"] *= 1 + 1e-12
    _system(b, "drifting")["drift"]["margin_st"] *= 1 - 1e-11
    b["sc"][0]["retention"][0]["ci_low"] *= 1 + 1e-10
    new = copy.deepcopy(_system(b, "voice_faithful"))
    new["system"] = "qwen_omni"
    b["s2s"].append(new)
    b["exclusions"]["s2s"]["qwen_omni"] = {"calls": 840, "describe_calls": 180, "failed": 2, "non_compliant": 5}
    b["provenance"]["model_revisions"]["qwen_omni"] = {"checkpoint": "Qwen/Qwen2.5-Omni-7B", "revision": "r1"}
    b["provenance"]["stimulus_set_sha256"] = "f" * 64
    return b


PLANTED_PATHS = [
    "provenance/model_revisions/qwen_omni",
    "provenance/stimulus_set_sha256",
    "s2s/content_driven/invariance/odds_ratio",
    "s2s/mixed/invariance/ci_high",
    "s2s/mixed/invariance/ci_low",
    "s2s/mixed/invariance/odds_ratio",
    "s2s/mixed/invariance/verdict",
    "exclusions/s2s/qwen_omni",
    "s2s/qwen_omni",
]

PLANTED_TEXT = """\
== speech-to-speech systems
  content_driven: OR per content step 30.2 [10.84, 84.13] -> 31 [10.84, 84.13]
  mixed: invariance inconclusive -> content-driven
  mixed: OR per content step 4.77 [2.043, 11.14] -> 9.8 [3.1, 30.2]
  qwen_omni: added (invariance voice-faithful, OR per content step 1.565 [0.7219, 3.392], RQ1 drift no drift detected)

== exclusions
  s2s qwen_omni: added (calls 840, describe_calls 180, failed 2, non_compliant 5)

== provenance
  model_revisions qwen_omni: added (checkpoint Qwen/Qwen2.5-Omni-7B, revision r1)
  stimulus_set_sha256: 4dba6d8666d5cfda60b00d58012da17be4fce0a5bd5ca05288d1508de502ffeb -> \
ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff"""


def test_the_planted_changes_and_nothing_else_are_reported(base, planted):
    diffs = compare_cards(base, planted)
    assert sorted(d.path for d in diffs) == sorted(PLANTED_PATHS)
    got = {d.path: d for d in diffs}
    assert got["s2s/mixed/invariance/verdict"] == Difference(
        "s2s/mixed/invariance/verdict", "inconclusive", "content-driven"
    )
    assert got["s2s/content_driven/invariance/odds_ratio"].new == 31.0
    added = got["s2s/qwen_omni"]
    assert added.old is ABSENT and added.new["invariance"]["verdict"] == "voice-faithful" and "system" not in added.new
    assert format_differences(diffs, base, planted) == PLANTED_TEXT


def test_removed_is_the_mirror_of_added(base, planted):
    diffs = compare_cards(planted, base)
    assert sorted(d.path for d in diffs) == sorted(PLANTED_PATHS)
    text = format_differences(diffs, planted, base)
    assert (
        "  qwen_omni: removed (was invariance voice-faithful, OR per content step 1.565 [0.7219, 3.392], "
        "RQ1 drift no drift detected)" in text
    )
    assert "  mixed: invariance content-driven -> inconclusive" in text


def test_identical_cards_and_a_reordered_card_have_no_differences(base):
    assert compare_cards(base, copy.deepcopy(base)) == []
    shuffled = copy.deepcopy(base)
    shuffled["s2s"].reverse()
    shuffled["sc"][0]["retention"].reverse()
    assert compare_cards(base, shuffled) == []
    assert format_differences([], base, shuffled) == "no differences"


def test_rtol_sets_which_numbers_count_as_equal(base, planted):
    assert "s2s/content_driven/invariance/odds_ratio" not in {d.path for d in compare_cards(base, planted, rtol=0.05)}
    assert "s2s/voice_faithful/invariance/odds_ratio" in {d.path for d in compare_cards(base, planted, rtol=0.0)}
    with pytest.raises(ValueError):
        compare_cards(base, planted, rtol=-1.0)


def test_checks_exclusions_planted_retention_and_provenance_lines(base):
    b = copy.deepcopy(base)
    b["checks"]["carrier_gate"].update(verdict="failed", flips=3)
    b["exclusions"]["s2s"]["mixed"]["non_compliant"] = 7
    b["exclusions"]["carrier_gate_excluded_stimuli"] = 3
    b["planted_vs_recovered"]["s2s"].update(
        recovered=31, not_recovered=["drifting: misgender_rate_aligned", "mixed: odds_ratio"]
    )
    b["sc"][0]["retention"][3]["retention"] = 0.5  # male h1_h2_db
    _system(b, "drifting")["drift"]["verdict"] = "inconclusive"
    _system(b, "drifting")["misgender"]["aligned"]["rate"] = 0.2
    b["provenance"]["model_revisions"]["drifting"]["revision"] = "reference-3"
    b["provenance"]["seeds"]["base.seed"] = 7
    assert (
        format_differences(compare_cards(base, b), base, b)
        == """\
== speech-to-speech systems
  drifting: RQ1 drift drifting toward the stereotype -> inconclusive
  drifting: misgender rate aligned 0.1167 [0.05768, 0.2218] -> 0.2 [0.05768, 0.2218]

== continuation systems
  continuation_reference: retention male h1_h2_db 0.7028 [0.693, 0.7117] -> 0.5 [0.693, 0.7117]

== checks
  carrier_gate verdict: passed -> failed
  carrier_gate flips: 0 -> 3

== exclusions
  carrier_gate_excluded_stimuli: 0 -> 3
  s2s mixed non_compliant: 3 -> 7

== planted vs recovered
  s2s not_recovered: [] -> [drifting: misgender_rate_aligned, mixed: odds_ratio]
  s2s recovered: 38 -> 31

== provenance
  model_revisions drifting revision: reference-2 -> reference-3
  seeds base.seed: 20260910 -> 7"""
    )


def test_a_change_below_the_shown_digits_gets_the_digits_to_show_it(base):
    b = copy.deepcopy(base)
    _system(b, "mixed")["invariance"]["odds_ratio"] = 4.769945485 * (1 + 1e-6)
    assert format_differences(compare_cards(base, b), base, b).splitlines()[1:] == [
        "  mixed: OR per content step 4.7699 [2.0432, 11.136] -> 4.77 [2.0432, 11.136]"
    ]


def test_cli_prints_the_report_or_json_and_exits_0(base, planted, tmp_path, capsys):
    a, b = _write(tmp_path / "a.json", base), _write(tmp_path / "b.json", planted)
    rc, out, err = _run([a, b], capsys)
    assert rc == 0 and out == PLANTED_TEXT + "\n"
    assert f"A is file {a}" in err and f"B is file {b}" in err
    rc, out, _ = _run([a, b, "--json"], capsys)
    got = {d["path"]: d for d in json.loads(out)}
    assert rc == 0 and sorted(got) == sorted(PLANTED_PATHS)
    assert got["s2s/mixed/invariance/odds_ratio"] == {
        "path": "s2s/mixed/invariance/odds_ratio",
        "old": 4.769945485,
        "new": 9.8,
    }
    assert got["s2s/qwen_omni"]["old"] is None and got["s2s/qwen_omni"]["new"]["invariance"]["odds_ratio"]
    rc, out, _ = _run([a, b, "--rtol", "0.1"], capsys)
    assert rc == 0 and "content_driven" not in out and "mixed: OR per content step" in out
    rc, out, _ = _run([a, a], capsys)
    assert rc == 0 and out == "no differences\n"
    rc, out, _ = _run([a, a, "--json"], capsys)
    assert rc == 0 and json.loads(out) == []


def test_a_folder_resolves_to_its_card_or_its_reports_card(base, planted, tmp_path, capsys):
    _write(tmp_path / "flat" / "audit_card.json", base)
    _write(tmp_path / "checkout" / "reports" / "report" / "audit_card.json", planted)
    assert resolve_card(str(tmp_path / "flat"))[0] == base
    card, source = resolve_card("checkout", cwd=tmp_path)
    assert card == planted and source == f"file {tmp_path / 'checkout' / 'reports' / 'report' / 'audit_card.json'}"
    rc, out, _ = _run([tmp_path / "flat", tmp_path / "checkout"], capsys)
    assert rc == 0 and out == PLANTED_TEXT + "\n"


def _git(cwd, *args):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args], cwd=cwd, check=True, capture_output=True
    )


def test_git_revisions_resolve_to_the_card_committed_there(base, planted, tmp_path, monkeypatch, capsys):
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    _git(repo, "init", "-q")
    for card, message in ((base, "first"), (planted, "second")):
        _write(repo / "reports" / "report" / "audit_card.json", card)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", message)
    monkeypatch.chdir(repo / "sub")  # the repository root is found from the working directory
    card, source = resolve_card("HEAD~1")
    assert card == base and source.startswith("git revision HEAD~1 (") and str(repo) in source
    rc, out, err = _run(["HEAD~1", "HEAD"], capsys)
    assert rc == 0 and out == PLANTED_TEXT + "\n" and "B is git revision HEAD" in err
    # a path wins over a revision of the same name
    _write(repo / "sub" / "HEAD", base)
    assert resolve_card("HEAD")[0] == base


@pytest.fixture(scope="module")
def mlflow_run(base, tmp_path_factory):
    """A local sqlite store with a pipeline parent run carrying the card as tracking logs it (under report/),
    and a run without one."""
    from mlflow.tracking import MlflowClient

    tmp = tmp_path_factory.mktemp("mlflow")
    report = _write(tmp / "report_dir" / "audit_card.json", base)
    uri = f"sqlite:///{tmp / 'mlruns' / 'mlflow.db'}"
    (tmp / "mlruns").mkdir()
    client = MlflowClient(uri)
    exp = client.create_experiment("voicebias", artifact_location=(tmp / "mlruns" / "artifacts").as_uri())
    parent = client.create_run(exp, run_name="pipeline-test")
    client.log_artifact(parent.info.run_id, str(report), CARD_ARTIFACT.rsplit("/", 1)[0])
    client.set_terminated(parent.info.run_id)
    bare = client.create_run(exp, run_name="no card")
    return tmp, uri, parent.info.run_id, bare.info.run_id


def test_an_mlflow_run_id_resolves_to_its_card_artifact(base, planted, mlflow_run, tmp_path, monkeypatch, capsys):
    _, uri, run_id, bare = mlflow_run
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    card, source = resolve_card(run_id)
    assert card == base and source == f"MLflow run {run_id} in {uri}: report/audit_card.json"
    b = _write(tmp_path / "b.json", planted)
    rc, out, err = _run([run_id, b], capsys)
    assert rc == 0 and out == PLANTED_TEXT + "\n" and f"A is MLflow run {run_id}" in err
    with pytest.raises(CardNotFound, match=f"run {bare} in .* has no artifact report/audit_card.json"):
        resolve_card(bare)


def test_without_the_environment_the_store_comes_from_params_tracking(base, mlflow_run, monkeypatch):
    """A relative sqlite URI in params.yaml is taken from the repository root, as tracking_uri does."""
    import yaml

    tmp, _, run_id, _ = mlflow_run
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["tracking"]["tracking_uri"] = "sqlite:///mlruns/mlflow.db"
    (tmp / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    _git(tmp, "init", "-q")
    (tmp / "deeper").mkdir(exist_ok=True)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    card, source = resolve_card(run_id, cwd=tmp / "deeper")
    assert card == base and f"sqlite:///{(tmp / 'mlruns' / 'mlflow.db').resolve()}" in source


def test_an_unresolvable_run_names_what_was_tried_and_exits_2(base, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    a = _write(tmp_path / "a.json", base)
    store = tmp_path / "none" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    rc, out, err = _run([a, "no-such-run"], capsys)
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        "voicebias compare: cannot resolve 'no-such-run' to an audit card; tried:",
        f"  path: no file or folder {REPO / 'no-such-run'}",
        f"  git revision: 'no-such-run' is not a revision of {REPO}",
        "  MLflow run id: 'no-such-run' is not an MLflow run id (32 hex digits)",
    ]
    rc, _, err = _run(["0" * 32, a], capsys)
    assert rc == 2 and f"MLflow run id: no MLflow store at {store}" in err
    assert not store.parent.exists()  # looking for a run never creates a store
    _write(tmp_path / "empty" / "x.json", base)
    with pytest.raises(CardNotFound, match="holds neither audit_card.json nor reports/report/audit_card.json"):
        resolve_card(str(tmp_path / "empty"))


def test_a_file_that_is_not_a_card_is_an_error(tmp_path, capsys):
    (tmp_path / "x.json").write_text('{"not": "a card"}')
    with pytest.raises(SystemExit) as exc:
        _run([tmp_path / "x.json", tmp_path / "x.json"], capsys)
    assert exc.value.code == 1
    assert "not an audit card" in capsys.readouterr().err


def test_the_command_runs_as_a_module(base, planted, tmp_path):
    a, b = _write(tmp_path / "a.json", base), _write(tmp_path / "b.json", planted)
    env = {k: v for k, v in os.environ.items() if k != "VOICEBIAS_ROOT"}
    done = subprocess.run(
        [sys.executable, "-m", "voicebias.cli", "compare", str(a), str(b)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == PLANTED_TEXT + "\n"


def test_a_model_that_changed_behind_its_name_is_warned_about(base, tmp_path, capsys):
    """Two runs of one API system answered under other system fingerprints (or model ids): compare
    warns on stderr, naming the system and both values; unchanged systems get no warning."""
    import copy

    def with_usage(card, fingerprints, model="gpt-4o-audio-preview-2025-06-03"):
        card = copy.deepcopy(card)
        card["usage"] = [
            {"system": "gpt_audio", "calls": 10, "model_ids": model, "fingerprints": fingerprints},
            {"system": "voice_faithful", "calls": 10, "model_ids": "ref-1", "fingerprints": None},
        ]
        return card

    a = _write(tmp_path / "a.json", with_usage(base, "fp_0a1b"))
    b = _write(tmp_path / "b.json", with_usage(base, "fp_0a1b; fp_9z9z"))
    rc, out, err = _run([a, b], capsys)
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert rc == 0 and len(warnings) == 1
    assert "gpt_audio" in warnings[0] and "fp_0a1b in A" in warnings[0] and "fp_0a1b, fp_9z9z in B" in warnings[0]
    c = _write(tmp_path / "c.json", with_usage(base, "fp_0a1b", model="gpt-4o-audio-preview-2025-09-01"))
    _, _, err = _run([a, c], capsys)
    assert "model id(s) gpt-4o-audio-preview-2025-06-03 in A" in err
    _, _, err = _run([a, a], capsys)
    assert "warning" not in err
