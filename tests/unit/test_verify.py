"""`voicebias verify`: this checkout's outputs against a revision's committed ones."""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from voicebias.verify import Tolerance, compare_file, tolerance_for, verify

REPO = Path(__file__).resolve().parents[2]

STAGE = """\
import sys, pathlib, numpy as np, soundfile as sf
out = pathlib.Path("reports/fits.csv"); out.parent.mkdir(parents=True, exist_ok=True)
out.write_text("term,estimate,p_value,converged,n\\nslope,0.123456789,0.0312,False,40\\n"
               "intercept,-1.5,1e-12,True,40\\n")
d = pathlib.Path("data/audio"); d.mkdir(parents=True, exist_ok=True)
t = np.arange(1600) / 16000
sf.write(d / "a.wav", 0.5 * np.sin(2 * np.pi * 220 * t), 16000, subtype="FLOAT")
pathlib.Path("reports/card.json").write_text('{"verdict": "content-driven", "odds_ratio": 30.19778951, "n": 120}\\n')
"""


def sh(*cmd: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "DVC_NO_ANALYTICS": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.org",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.org",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=True)


@pytest.fixture(scope="module")
def committed(tmp_path_factory) -> Path:
    """A committed DVC project: a git-tracked table and card, a DVC-cached audio folder (made once)."""
    root = tmp_path_factory.mktemp("verify") / "audit"
    root.mkdir()
    (root / "make.py").write_text(STAGE)
    (root / "dvc.yaml").write_text(
        "stages:\n  make:\n    cmd: python make.py\n    deps: [make.py]\n    outs:\n"
        "    - data/audio\n    - reports/fits.csv:\n        cache: false\n"
        "    - reports/card.json:\n        cache: false\n"
    )
    sh("git", "init", "-q", cwd=root)
    sh("dvc", "init", "-q", cwd=root)
    sh("dvc", "repro", "-q", cwd=root)
    sh("git", "add", "-A", cwd=root)
    sh("git", "commit", "-qm", "audit", cwd=root)
    return root


@pytest.fixture()
def project(committed: Path, tmp_path: Path) -> Path:
    """A copy of the committed project of its own, which the test may edit."""
    import shutil

    root = tmp_path / "audit"
    shutil.copytree(committed, root, symlinks=True)
    return root


def cli(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "voicebias.cli", "verify", *args, "--repo", str(root)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_a_clean_run_is_identical(project):
    done = cli(project, "HEAD")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("voicebias verify HEAD: identical (3 files: 3 identical")


def test_a_number_changed_in_its_last_bits_is_the_same_result(project):
    edit(project / "reports/fits.csv", "0.123456789", repr(0.123456789 * (1 + 1e-12)))
    done = cli(project)
    assert done.returncode == 0, done.stderr
    first, *rest = done.stdout.splitlines()
    assert first.startswith("voicebias verify HEAD: same results within tolerance (3 files: 2 identical, 1 within")
    assert "reports/fits.csv row 1 column estimate" in "\n".join(rest)


def test_a_changed_verdict_is_a_different_result(project):
    edit(project / "reports/fits.csv", "0.123456789,0.0312,False", "0.123456789,0.0312,True")
    done = cli(project)
    assert done.returncode == 1
    assert done.stdout.splitlines()[0].startswith("voicebias verify HEAD: different results")
    assert "reports/fits.csv row 1 column converged: committed 'False' here 'True'" in done.stdout


def test_a_count_and_a_category_in_json_compare_exactly(project):
    edit(project / "reports/card.json", '"n": 120', '"n": 121')
    assert cli(project).returncode == 1
    edit(project / "reports/card.json", '"n": 121', '"n": 120')
    edit(project / "reports/card.json", "30.19778951", "30.19778952")  # 3e-10 relative
    assert cli(project).returncode == 0


def test_dvc_tracked_audio_is_read_from_the_cache_and_compared_by_sample(project):
    wav = project / "data/audio/a.wav"
    x, sr = sf.read(wav)
    sf.write(wav, x + 1e-6, sr, subtype="FLOAT")  # far below the audio tolerance
    verdict = verify("HEAD", project, progress=False)
    assert verdict.status == "same results within tolerance"
    sf.write(wav, x * 0.5, sr, subtype="FLOAT")
    assert verify("HEAD", project, progress=False).status == "different results"
    wav.unlink()
    done = cli(project)
    assert done.returncode == 1 and "data/audio/a.wav file: committed present here missing" in done.stdout


def test_a_file_an_output_folder_gained_is_a_difference(project):
    (project / "data/audio/b.wav").write_bytes((project / "data/audio/a.wav").read_bytes())
    verdict = verify("HEAD", project, progress=False)
    assert verdict.status == "different results"
    assert [f.path for f in verdict.files if f.kind == "different"] == ["data/audio/b.wav"]


def test_an_earlier_revision_is_compared_too(project):
    edit(project / "reports/fits.csv", "0.0312", "0.0412")
    sh("git", "commit", "-qam", "new p", cwd=project)
    assert cli(project, "HEAD").returncode == 0
    done = cli(project, "HEAD~1")
    assert done.returncode == 1 and "column p_value: committed 0.0312 here 0.0412" in done.stdout


def test_an_unknown_revision_is_one_line(project):
    done = cli(project, "no-such-rev")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "cannot read dvc.lock at 'no-such-rev'" in done.stderr


def test_committed_outputs_missing_from_the_cache_say_to_fetch_them(project):
    """Another machine's clone has its own bytes in its cache, not the committed ones: verify
    names the output and the command that fetches it, in one line, instead of a traceback."""
    import shutil

    shutil.rmtree(project / ".dvc" / "cache")
    done = cli(project, "HEAD")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert (
        "HEAD's data/audio/" in done.stderr and "is in neither this checkout's DVC cache nor its remote" in done.stderr
    )
    assert "dvc pull" in done.stderr


def test_tolerances_are_relative_and_absolute_per_column():
    assert tolerance_for("p_value") == Tolerance(rel=1e-4, abs=1e-10)
    assert tolerance_for("estimate") == Tolerance(rel=1e-6, abs=1e-9)
    tol = tolerance_for("estimate")
    assert tol.agree(1.0, 1.0 + 9e-7) and not tol.agree(1.0, 1.0 + 2e-6)
    assert tol.agree(0.0, 5e-10) and not tol.agree(0.0, 2e-9)
    assert tol.agree(math.nan, math.nan) and not tol.agree(math.nan, 0.0)
    assert tol.agree(math.inf, math.inf) and not tol.agree(math.inf, -math.inf)


def test_rendered_numbers_may_differ_by_one_unit_of_their_last_digit():
    a = b"| system | OR |\n| content_driven | 30.20 |\n"
    assert compare_file("r.md", a, a.replace(b"30.20", b"30.21")).kind == "within"
    assert compare_file("r.md", a, a.replace(b"30.20", b"30.22")).kind == "different"
    assert compare_file("r.md", a, a.replace(b"content_driven", b"voice_faithful")).kind == "different"


def test_images_are_renderings_and_other_binaries_must_match():
    assert compare_file("fig.png", b"\x89PNG a", b"\x89PNG b").kind == "rendering"
    assert compare_file("blob.bin", b"a", b"b").kind == "different"
    buf_a, buf_b = io.BytesIO(), io.BytesIO()
    sf.write(buf_a, np.zeros(100), 16000, format="WAV")
    sf.write(buf_b, np.zeros(120), 16000, format="WAV")
    assert compare_file("x.wav", buf_a.getvalue(), buf_b.getvalue()).kind == "different"
