"""A scratch clone of this repository with a reduced bank, on which `dvc repro` has run.

Shared by the end-to-end tests (one pipeline run per test session).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from voicebias import config

PASSAGES_PER_CELL = 3
SC_PROMPTS = 3
BIN = Path(sys.executable).parent


def sh(cmd, cwd, check=True):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "DVC_NO_ANALYTICS": "1"}
    env.pop("VOICEBIAS_ROOT", None)
    env.pop("MLFLOW_TRACKING_URI", None)  # the workspace logs to its own mlflow.db
    res = subprocess.run(cmd, cwd=cwd, shell=True, capture_output=True, text=True, env=env)
    if check and res.returncode != 0:
        raise AssertionError(f"`{cmd}` failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res


def tree_hashes(root: Path, sub: str) -> dict[str, str]:
    out = {}
    for p in sorted((root / sub).rglob("*")):
        if p.is_file() and p.name != ".gitignore":
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def make_workspace(tmp_path_factory):
    base = tmp_path_factory.mktemp("pipeline")
    repo = base / "voicebias"
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=config.ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    for f in filter(None, files):
        src = config.ROOT / f
        if not src.is_file() or f == "dvc.lock" or f.startswith("reports/"):
            continue
        dst = repo / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    for lang in ("en", "es", "zh"):
        path = repo / "data" / "bank" / f"{lang}.yaml"
        entries = yaml.safe_load(path.read_text(encoding="utf-8"))
        keep, seen = [], {}
        for e in entries:
            seen[e["pole"]] = seen.get(e["pole"], 0) + 1
            if seen[e["pole"]] <= PASSAGES_PER_CELL:
                keep.append(e)
        path.write_text(yaml.safe_dump(keep, allow_unicode=True, sort_keys=False), encoding="utf-8")
    # the speech-continuation study on 3 prompts (x 4 voices x 4 phonation conditions)
    params = (repo / "params.yaml").read_text(encoding="utf-8")
    for old, new in (
        ("max_prompts: null", f"max_prompts: {SC_PROMPTS}"),
        ("passages_per_pole: 4", "passages_per_pole: 1"),  # the continuum from one passage per pole
    ):
        assert old in params, old
        params = params.replace(old, new)
    (repo / "params.yaml").write_text(params, encoding="utf-8")
    sh("git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm init", repo)
    res = sh("dvc repro", repo)
    sh("git add -A && git -c user.name=t -c user.email=t@t commit -qm repro && git tag repro", repo)
    return base, repo, res


#: the kernels another processor would choose, played on this one by the variables the
#: numerical libraries read (voicebias.codepaths overrides them on every x86-64-v3 machine):
#: OpenBLAS's AVX-512 core where this CPU has AVX-512, else Sandybridge's (OpenBLAS aliases Zen
#: to Haswell's kernels, the fixed ones), PyTorch's and numba's own choice of instruction set
def played_machine() -> dict[str, str]:
    from voicebias.codepaths import cpu_flags

    core = "SkylakeX" if "avx512f" in cpu_flags() else "Sandybridge"
    return {"OPENBLAS_CORETYPE": core, "ATEN_CPU_CAPABILITY": "default", "NUMBA_CPU_NAME": "generic"}


class FreshClone:
    """A newcomer's path on another machine, started in the background: `git clone` of the
    reproduced commit, then README command 1's `dvc repro` with empty caches (no DVC cache, no
    response, measurement or embedding cache, no MLflow store), with the kernels another processor
    would choose played (`played_machine`). It runs while the other end-to-end tests use the
    workspace (the clone shares nothing with it); `result()` waits for it."""

    def __init__(self, base: Path, repo: Path):
        import shlex
        import time

        self.path = base / "fresh"
        sh(f"git clone -q --branch repro {repo} {self.path}", base)
        assert not (self.path / ".dvc" / "cache").exists() and not (self.path / ".cache").exists()
        self.played = played_machine()
        env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "DVC_NO_ANALYTICS": "1"}
        for var in ("VOICEBIAS_ROOT", "MLFLOW_TRACKING_URI"):
            env.pop(var, None)
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.played.items())
        self.cmd = f"env {prefix} dvc repro"
        self._out = open(base / "fresh-repro.out", "w+")
        self._err = open(base / "fresh-repro.err", "w+")
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(self.cmd, cwd=self.path, shell=True, stdout=self._out, stderr=self._err, env=env)
        self._result: tuple[Path, subprocess.CompletedProcess, float, dict[str, str]] | None = None

    def result(self) -> tuple[Path, subprocess.CompletedProcess, float, dict[str, str]]:
        """(clone, repro result, seconds from its start to its end, the played variables)."""
        import time

        if self._result is None:
            rc = self.proc.wait()
            seconds = time.perf_counter() - self.t0
            self._out.seek(0)
            self._err.seek(0)
            res = subprocess.CompletedProcess(self.cmd, rc, self._out.read(), self._err.read())
            self._out.close()
            self._err.close()
            if rc != 0:
                raise AssertionError(f"`{self.cmd}` failed ({rc}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
            self._result = (self.path, res, seconds, self.played)
        return self._result

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def make_hostile(base: Path, repo: Path) -> tuple[Path, subprocess.CompletedProcess, dict[str, str]]:
    """The reproduced workspace (tag 'repro') with the misbehaving reference system `hostile`
    added to run.systems, after `dvc repro`: (clone, repro result, hashes of every tracked file
    under data/ and reports/ before the system was added). The clone shares the workspace's DVC
    cache and starts from a copy of its response, render and measurement caches, so only what
    the new system changes is made."""
    clone = base / "hostile"
    sh(f"git clone -q --branch repro {repo} {clone}", base)
    sh(f"dvc cache dir --local {repo / '.dvc' / 'cache'}", clone)
    shutil.copytree(repo / ".cache", clone / ".cache", symlinks=True)
    sh("dvc checkout -q", clone)
    before = {**tree_hashes(clone, "data"), **tree_hashes(clone, "reports")}
    path = clone / "params.yaml"
    params = path.read_text(encoding="utf-8")
    old = "systems: [voice_faithful, content_driven, mixed, drifting]"
    assert old in params, old
    path.write_text(
        params.replace(old, "systems: [voice_faithful, content_driven, mixed, drifting, hostile]"), encoding="utf-8"
    )
    res = sh("dvc repro", clone, check=False)
    return clone, res, before
