"""Every failure a user can cause is one line on stderr and a non-zero exit, never a traceback.

Each case runs a CLI command (or a stage) in a scratch project (VOICEBIAS_ROOT) whose
files one case has damaged, the way a user would: a YAML syntax error or bad UTF-8 in
params.yaml or the bank, a table that is not a table, a folder where a file belongs,
non-UTF-8 JSON given to `compare`. VOICEBIAS_DEBUG=1 shows the traceback.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from voicebias import config

LATIN1 = "caf\xe9: 1\n".encode("latin-1")  # a byte that is not UTF-8


def scratch_root(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "data").mkdir(parents=True)
    for rel in ("params.yaml", "dvc.yaml"):
        shutil.copy(config.ROOT / rel, root / rel)
    for rel in ("data/tasks", "data/bank", "profiles"):
        shutil.copytree(config.ROOT / rel, root / rel)
    (root / "models").symlink_to(config.ROOT / "models")
    return root


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + text, encoding="utf-8")


def _tone(path: Path, seconds: float) -> Path:
    sr = 16000
    t = np.arange(int(seconds * sr)) / sr
    sf.write(path, (0.3 * np.sin(2 * np.pi * 150 * t)).astype(np.float32), sr)
    return path


# (id, command line, what to damage in the scratch project, words the one line must hold)
CASES = [
    (
        "params-yaml-syntax",
        ["preflight"],
        lambda r: _append(r / "params.yaml", "run: [unclosed\n"),
        ["params.yaml", "not valid YAML", "line"],
    ),
    (
        "params-bad-utf8",
        ["systems"],
        lambda r: (r / "params.yaml").write_bytes((r / "params.yaml").read_bytes() + b"# " + LATIN1),
        ["params.yaml", "not UTF-8"],
    ),
    (
        "tasks-yaml-syntax",
        ["tasks"],
        lambda r: _append(r / "data/tasks/prompts.yaml", "\n  - : :\n\t bad\n"),
        ["prompts.yaml", "not valid YAML"],
    ),
    (
        "bank-bad-utf8",
        ["bank", "lint"],
        lambda r: (r / "data/bank/en.yaml").write_bytes((r / "data/bank/en.yaml").read_bytes() + b"# " + LATIN1),
        ["en.yaml", "not UTF-8"],
    ),
    (
        "bank-yaml-syntax",
        ["bank", "render", "--lang", "es", "--out", "out"],
        lambda r: _append(r / "data/bank/es.yaml", "- id: [\n"),
        ["es.yaml", "not valid YAML"],
    ),
    ("unknown-profile", ["profile", "nosuch"], None, ["no profile 'nosuch'"]),
    ("analyze-missing-table", ["analyze", "describe", "missing.csv"], None, ["missing.csv"]),
    (
        "analyze-binary-table",
        ["analyze", "describe", "table.csv"],
        lambda r: (r / "table.csv").write_bytes(b"\xff\xfe\x00\x01garbage\x00" * 50),
        ["table.csv"],
    ),
    ("analyze-folder-as-table", ["analyze", "summarize", "data"], None, ["data", "folder"]),
    (
        "analyze-wrong-columns",
        ["analyze", "describe", "table.csv"],
        lambda r: (r / "table.csv").write_text("a,b\n1,2\n", encoding="utf-8"),
        ["column"],
    ),
    (
        "measure-out-is-folder",
        ["measure", "tone.wav", "--out", "data"],
        lambda r: _tone(r / "tone.wav", 1.0),
        ["--out", "data"],
    ),
    (
        "measure-textgrid-not-a-textgrid",
        ["measure", "tone.wav", "--tier", "vowels"],
        lambda r: (_tone(r / "tone.wav", 1.0), (r / "tone.TextGrid").write_text("not a TextGrid\n")),
        ["tone.TextGrid", "not a TextGrid Praat can read"],
    ),
    (
        "measure-textgrid-no-such-tier",
        ["measure", "tone.wav", "--tier", "vowels"],
        lambda r: (
            _tone(r / "tone.wav", 1.0),
            (r / "tone.TextGrid").write_text(
                'File type = "ooTextFile"\nObject class = "TextGrid"\n\n0\n1\n<exists>\n1\n'
                '"IntervalTier"\n"words"\n0\n1\n1\n0\n1\n"a"\n'
            ),
        ),
        ["no tier 'vowels'", "words"],
    ),
    (
        "compare-not-utf8",
        ["compare", "a.json", "b.json"],
        lambda r: ((r / "a.json").write_bytes(b'{"s2s": [], "x": "\xe9"}'), (r / "b.json").write_text('{"s2s": []}')),
        ["a.json", "not UTF-8"],
    ),
    (
        "compare-not-json",
        ["compare", "a.json", "b.json"],
        lambda r: ((r / "a.json").write_text("{s2s: oops"), (r / "b.json").write_text('{"s2s": []}')),
        ["a.json", "not JSON"],
    ),
    (
        "ui-damaged-marker",
        ["ui"],
        lambda r: ((r / "mlruns").mkdir(), (r / "mlruns" / "last_run.json").write_text("{oops")),
        ["last_run.json", "not JSON"],
    ),
    ("fetch-unknown-system", ["fetch", "nosuch_system", "--dry-run"], None, ["nosuch_system"]),
    ("canary-not-a-run", ["canary", "no/such/run"], None, ["no stimulus manifest", "no/such/run"]),
    ("release-into-a-full-folder", ["release", "data"], None, ["data", "not empty"]),
    ("replicate-not-a-bundle", ["replicate", "data"], None, ["MANIFEST.json", "not a voicebias release bundle"]),
    ("serve-unknown-system", ["serve", "nosuch_system"], None, ["nosuch_system"]),
    ("verify-not-a-repository", ["verify", "HEAD"], None, ["dvc.lock", "not a git repository"]),
    ("verify-missing-folder", ["verify", "--repo", "no/such/folder"], None, ["no/such/folder"]),
    ("dev-deps-missing-folder", ["dev", "deps", "--repo", "no/such/folder"], None, ["no/such/folder", "dvc.yaml"]),
    (
        "dev-deps-yaml-syntax",
        ["dev", "deps"],
        lambda r: (r / "dvc.yaml").write_text("stages: [\n", encoding="utf-8"),
        ["dvc.yaml", "not valid YAML"],
    ),
    (
        "dev-deps-stage-without-module",
        ["dev", "deps", "--check"],
        lambda r: (r / "dvc.yaml").write_text("stages:\n  x:\n    cmd: make\n    deps:\n      - a\n", encoding="utf-8"),
        ["stage x", "python -m"],
    ),
]


def run_cli(root: Path, argv: list[str], stage: str | None = None, debug: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VOICEBIAS_DEBUG",)}
    env.update(
        VOICEBIAS_ROOT=str(root),
        VOICEBIAS_CACHE=str(root / ".cache"),
        PYTHONWARNINGS="ignore",
        PYTHONPATH=str(config.ROOT),
    )
    if debug:
        env["VOICEBIAS_DEBUG"] = "1"
    cmd = [sys.executable, "-m", stage] if stage else [sys.executable, "-m", "voicebias.cli", *argv]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def assert_one_line(res: subprocess.CompletedProcess, words: list[str]) -> str:
    assert res.returncode != 0, res.stdout[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr[-3000:]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("case, argv, damage, words", CASES, ids=[c[0] for c in CASES])
def test_a_bad_input_is_one_line_and_a_non_zero_exit(tmp_path, case, argv, damage, words):
    root = scratch_root(tmp_path)
    if damage is not None:
        damage(root)
    line = assert_one_line(run_cli(root, argv), words)
    assert line.startswith("voicebias "), line


def test_a_stage_on_a_broken_bank_is_one_line(tmp_path):
    root = scratch_root(tmp_path)
    _append(root / "data/bank/en.yaml", "- id: [\n")
    assert_one_line(run_cli(root, [], stage="stages.bank"), ["en.yaml", "not valid YAML"])


def test_voicebias_debug_shows_the_traceback(tmp_path):
    root = scratch_root(tmp_path)
    _append(root / "params.yaml", "run: [unclosed\n")
    res = run_cli(root, ["preflight"], debug=True)
    assert res.returncode != 0 and "Traceback" in res.stderr and "not valid YAML" in res.stderr


@pytest.mark.parametrize(
    "given, reason, words",
    [("data", "not_audio", "a folder, not an audio file"), ("nosuch.wav", "missing", "file not found")],
)
def test_measure_reports_a_bad_file_as_its_row_and_its_line(tmp_path, given, reason, words):
    # `measure` reports per file: a file it cannot read is that file's row (with its reason) and one
    # line naming it, and with nothing measured the command exits non-zero; no traceback
    root = scratch_root(tmp_path)
    res = run_cli(root, ["measure", given])
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert f"voicebias measure: {given}: refused ({reason}): {words}" in res.stderr
    assert f"\n{given},whole,,,,excluded,{reason}," in res.stdout


def test_the_respond_stage_behind_a_failed_carrier_gate_is_one_line(tmp_path):
    root = scratch_root(tmp_path)
    gate = root / "reports" / "carrier_gate" / "metrics.json"
    gate.parent.mkdir(parents=True)
    gate.write_text('{"passed": false}\n', encoding="utf-8")
    res = subprocess.run(
        [sys.executable, "-m", "stages.respond", "--system", "voice_faithful"],
        cwd=config.ROOT,
        env={
            **os.environ,
            "VOICEBIAS_ROOT": str(root),
            "VOICEBIAS_CACHE": str(root / ".cache"),
            "PYTHONWARNINGS": "ignore",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_one_line(res, ["voicebias respond voice_faithful:", "has not passed"])


def test_every_command_has_a_bad_input_case():
    import argparse

    from voicebias.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) - {argv[0] for _, argv, _, _ in CASES} == set()
