"""A scratch clone of this repository with a reduced bank, on which `dvc repro` has run.

Shared by the end-to-end tests (one pipeline run per test session). The run starts from empty
caches with another processor's kernels played (`played_machine`), and every output it writes
must equal, byte for byte, the reduced profile's reference hashes in `REFERENCE`, which a plain
run on the machine that committed them wrote. After a change that changes an output on purpose,
write them again (one reduced run, about 3 minutes on 2 cores):

    python -m tests.support.workspace --write-reference
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
#: sha256 of every file the reduced profile's `dvc repro` writes under data/ and reports/, in
#: `sha256sum` format (`sha256sum -c` checks a workspace against it)
REFERENCE = config.ROOT / "tests" / "fixtures" / "reduced_profile.sha256"


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


def make_workspace(tmp_path_factory, played: dict[str, str] | None = None):
    """(base folder, repository, repro result): the reduced profile in a new git repository under
    a fresh temporary folder, after `dvc repro` with every cache empty (no DVC cache, no response,
    measurement or embedding cache, no MLflow store) and `played`'s variables set for that run."""
    return build_workspace(tmp_path_factory.mktemp("pipeline"), played)


def build_workspace(base: Path, played: dict[str, str] | None = None):
    import shlex

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
    assert not (repo / ".dvc" / "cache").exists() and not (repo / ".cache").exists()
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (played or {}).items())
    res = sh(f"env {prefix} dvc repro" if prefix else "dvc repro", repo)
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


def output_hashes(repo: Path) -> dict[str, str]:
    """Path -> sha256 of every file under data/ and reports/ (what `REFERENCE` records)."""
    return {**tree_hashes(repo, "data"), **tree_hashes(repo, "reports")}


def read_reference(path: Path = REFERENCE) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        digest, name = line.split("  ", 1)
        out[name] = digest
    return out


def write_reference(path: Path = REFERENCE) -> int:
    """Run the reduced profile from empty caches, with nothing played, in a temporary folder, and
    write the sha256 of every output to `path`; returns the number of files."""
    import tempfile

    if os.environ.get("VOICEBIAS_CODE_PATHS", "avx2") != "avx2":
        raise SystemExit("unset VOICEBIAS_CODE_PATHS: the reference is written on the default code paths")
    with tempfile.TemporaryDirectory(prefix="voicebias-reference-") as tmp:
        _, repo, _ = build_workspace(Path(tmp))
        hashes = output_hashes(repo)
    path.write_text("".join(f"{d}  {name}\n" for name, d in sorted(hashes.items())), encoding="utf-8")
    return len(hashes)


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
    before = output_hashes(clone)
    path = clone / "params.yaml"
    params = path.read_text(encoding="utf-8")
    old = "systems: [voice_faithful, content_driven, mixed, drifting]"
    assert old in params, old
    path.write_text(
        params.replace(old, "systems: [voice_faithful, content_driven, mixed, drifting, hostile]"), encoding="utf-8"
    )
    res = sh("dvc repro", clone, check=False)
    return clone, res, before


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="The reduced profile's reference output hashes")
    parser.add_argument("--write-reference", action="store_true", help=f"run the reduced profile and write {REFERENCE}")
    if parser.parse_args().write_reference:
        n = write_reference()
        print(f"wrote the sha256 of {n} outputs to {REFERENCE.relative_to(config.ROOT)}")
    else:
        parser.print_help()
