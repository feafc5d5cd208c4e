"""Other machines, played on this one: the measuring, embedding and analysis stages write the
same bytes whatever kernels the processor would choose (voicebias.codepaths).

Each played machine sets the variables by which the numerical libraries would pick their
code on that processor (OpenBLAS's core type, ATen's and oneDNN's instruction-set caps,
NumPy's dispatch, numba's target) and runs the stages again on the reproduced workspace,
with empty measurement and embedding caches so that every measure and embedding is
computed again. Every byte under the stages' outputs must equal the native run's."""

from __future__ import annotations

import os
import shlex
import shutil
import time

import pytest

from tests.workspace import sh, tree_hashes
from voicebias.codepaths import NUMPY_ABOVE_V3, cpu_flags

FLAGS = cpu_flags()
CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "NUMBA_CPU_NAME": "haswell"}
# core type -> the CPU flag it needs
CORE_TYPES = {"Haswell": "avx2", "SkylakeX": "avx512f", "Zen": "avx2", "Prescott": "pni"}
STAGES = [
    "python -m stages.sc_scoring --system continuation_reference",
    "python -m stages.sc_analysis",
    "python -m stages.acoustic_scoring --system drifting",
    "python -m stages.phonation_check",
    "python -m stages.analysis",
    "python -m stages.disaggregate",
]
OUTPUTS = [
    "data/sc_scored",
    "reports/sc",
    "data/scored",
    "reports/phonation",
    "reports/analysis",
    "reports/disaggregated",
]


def runnable() -> list[str]:
    return [core for core, flag in CORE_TYPES.items() if flag in FLAGS]


@pytest.mark.skipif("avx2" not in FLAGS, reason="plays x86-64 machines: needs an x86-64 processor with AVX2")
def test_every_core_type_this_machine_runs_writes_the_native_bytes(workspace):
    base, repo, _ = workspace
    clone = base / "codepaths"
    sh(f"git clone -q --branch repro {repo} {clone}", base)
    sh(f"dvc cache dir --local {repo / '.dvc' / 'cache'}", clone)
    sh("dvc checkout -q", clone)
    native = {k: v for o in OUTPUTS for k, v in tree_hashes(clone, o).items()}
    assert any(k.startswith("reports/sc/") for k in native) and any(k.startswith("data/sc_scored/") for k in native)
    seconds, differ = {}, {}
    for core in runnable():
        env = {"OPENBLAS_CORETYPE": core, **CAPS, "VOICEBIAS_CACHE": str(base / f"cache-{core}")}
        if "avx512f" in FLAGS and core != "SkylakeX":
            env["NPY_DISABLE_CPU_FEATURES"] = NUMPY_ABOVE_V3
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        t0 = time.perf_counter()
        for cmd in STAGES:
            sh(f"env {prefix} {cmd}", clone)
        seconds[core] = time.perf_counter() - t0
        now = {k: v for o in OUTPUTS for k, v in tree_hashes(clone, o).items()}
        differ[core] = sorted(k for k in native.keys() | now.keys() if native.get(k) != now.get(k))
        shutil.rmtree(base / f"cache-{core}", ignore_errors=True)
    print(
        "\nplayed machines: "
        + ", ".join(f"{c} {s:.0f} s" for c, s in seconds.items())
        + f"; {len(native)} files compared each"
    )
    assert seconds and len(seconds) == len(runnable())
    assert all(not d for d in differ.values()), differ
    assert os.environ.get("VOICEBIAS_CODE_PATHS", "avx2") == "avx2"
