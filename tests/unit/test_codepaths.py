"""The numerical libraries' code paths, fixed when voicebias is imported (voicebias.codepaths)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from voicebias.codepaths import (
    ALWAYS,
    AVX2_PATHS,
    MODE_VARIABLE,
    NUMPY_ABOVE_V3,
    V3_FLAGS,
    CodePathError,
    cpu_flags,
    plan,
)

REPO = Path(__file__).resolve().parents[2]
V3 = V3_FLAGS | {"sse2", "sse4_2"}

PROBE = """
import voicebias, json, sys
import numpy, threadpoolctl, torch, numba
from numpy._core._multiarray_umath import __cpu_features__ as f
from voicebias.parallel import map_processes
def arch(_):
    import numpy, threadpoolctl
    return [i.get("architecture") for i in threadpoolctl.threadpool_info() if i.get("internal_api") == "openblas"]
print(json.dumps({"openblas": arch(0), "worker_openblas": map_processes(arch, [0, 1], workers=2),
                  "numpy_x86_v4": bool(f.get("X86_V4")), "torch": torch.backends.cpu.get_cpu_capability(),
                  "numba": numba.config.CPU_NAME, "record": voicebias.codepaths.describe()}))
"""


def probe(**env: str) -> dict:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in AVX2_PATHS and k != MODE_VARIABLE and k != "NPY_DISABLE_CPU_FEATURES"
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env={**base, **env}, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_every_x86_64_v3_machine_gets_the_avx2_paths_and_others_none():
    assert plan({}, V3, "x86_64") == {**ALWAYS, **AVX2_PATHS}
    assert plan({}, V3 | {"avx512f"}, "x86_64") == {**ALWAYS, **AVX2_PATHS, "NPY_DISABLE_CPU_FEATURES": NUMPY_ABOVE_V3}
    assert plan({}, V3 - {"avx2"}, "x86_64") == ALWAYS  # an x86-64 without AVX2 keeps its own kernels
    assert plan({}, {"fp", "asimd"}, "aarch64") == ALWAYS  # ARM: no x86 variables
    assert plan({MODE_VARIABLE: "native"}, V3 | {"avx512f"}, "x86_64") == ALWAYS
    assert plan({MODE_VARIABLE: " AVX2 "}, V3, "x86_64") == {**ALWAYS, **AVX2_PATHS}
    with pytest.raises(CodePathError, match="VOICEBIAS_CODE_PATHS='fast': use one of avx2, native"):
        plan({MODE_VARIABLE: "fast"}, V3, "x86_64")


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(info) == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert cpu_flags(tmp_path / "missing") == set()


def test_an_unknown_mode_stops_with_one_line():
    done = subprocess.run(
        [sys.executable, "-c", "import voicebias"],
        env={**os.environ, MODE_VARIABLE: "fast"},
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "voicebias: VOICEBIAS_CODE_PATHS='fast': use one of avx2, native"
    ]


@pytest.mark.skipif(not V3_FLAGS <= cpu_flags(), reason="needs an x86-64-v3 processor")
def test_the_paths_hold_in_the_process_and_its_workers_whatever_the_machine_would_choose():
    """A machine's own choice (played by the libraries' variables: OpenBLAS's SkylakeX
    kernels, PyTorch's and NumPy's AVX-512 loops) is overridden in the process that imports
    voicebias and in its worker processes; VOICEBIAS_CODE_PATHS=native leaves it."""
    played = {
        # a core OpenBLAS reports under its own name and runs here: its AVX-512 kernels where the CPU
        # has them, else Sandybridge's (AVX); not Zen, which OpenBLAS's builds alias to Haswell's
        # kernels, so an AMD machine's native choice is the fixed one already
        "OPENBLAS_CORETYPE": "SkylakeX" if "avx512f" in cpu_flags() else "Sandybridge",
        "ATEN_CPU_CAPABILITY": "default",
        "NUMBA_CPU_NAME": "generic",
    }
    fixed = probe(**played)
    assert fixed["openblas"] == ["Haswell"] and fixed["worker_openblas"] == [["Haswell"], ["Haswell"]]
    assert fixed["torch"] == "AVX2" and fixed["numba"] == "haswell" and fixed["numpy_x86_v4"] is False
    assert fixed["record"]["mode"] == "avx2" and fixed["record"]["loaded_before"] == []
    assert fixed["record"]["variables"]["OPENBLAS_CORETYPE"] == "Haswell"
    native = probe(**played, VOICEBIAS_CODE_PATHS="native")
    assert native["openblas"] == [played["OPENBLAS_CORETYPE"]] and native["numba"] == "generic"
    assert native["record"]["mode"] == "native"


def test_cached_measures_and_embeddings_are_keyed_by_the_code_paths():
    """A measure or embedding computed under the native kernels is not served to a run under the
    fixed ones (or the other way round): the processes' cache keys differ, and within one mode
    they are the same."""
    script = (
        "import voicebias, json\n"
        "from voicebias.instruments import acoustics, measure_cache\n"
        "from voicebias.instruments.acoustics import MeasureSettings\n"
        "print(json.dumps(measure_cache.component_key('pitch', '0' * 64, 'whole', 16000, MeasureSettings(),"
        " acoustics)))"
    )

    def key(**env: str) -> str:
        out = subprocess.run(
            [sys.executable, "-c", script], env={**os.environ, **env}, capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout)

    fixed, native = key(**{MODE_VARIABLE: "avx2"}), key(**{MODE_VARIABLE: "native"})
    assert fixed == key(**{MODE_VARIABLE: "avx2"})
    if "OPENBLAS_CORETYPE" in plan({MODE_VARIABLE: "avx2"}):
        assert fixed != native
