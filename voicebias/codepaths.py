"""The code paths voicebias's numerical libraries take, fixed once for every process.

OpenBLAS, NumPy, PyTorch (ATen), oneDNN, numba and MKL each choose their kernels by the processor
they find, and the last bits of a fit or an embedding differ with them. On an x86-64-v3 processor
voicebias asks each library for its AVX2 path, so every such machine computes the same bytes.
:func:`apply` sets the variables when the ``voicebias`` package is imported, before NumPy, and
worker processes inherit them. ``VOICEBIAS_CODE_PATHS`` chooses ``avx2`` (the default) or
``native``; other processors get only the always-set variables, and ``voicebias verify`` compares
their results with tolerances.

The variables and the modes: docs/reproducibility.md, "Code paths of the numerical libraries".
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

from voicebias.errors import ConfigError

MODE_VARIABLE = "VOICEBIAS_CODE_PATHS"
MODES = ("avx2", "native")

# What every x86-64-v3 processor runs, as each library names it.
AVX2_PATHS = {
    "OPENBLAS_CORETYPE": "Haswell",  # OpenBLAS's AVX2/FMA kernels (numpy's and scipy's copies)
    "ATEN_CPU_CAPABILITY": "avx2",  # PyTorch's own vectorised kernels
    "ONEDNN_MAX_CPU_ISA": "AVX2",  # oneDNN's JIT kernels (PyTorch's convolutions, LSTMs)
    "NUMBA_CPU_NAME": "haswell",  # LLVM's target for the instrument's compiled loops
}
# NumPy 2's names for its dispatch targets above x86-64-v3; set only where the CPU has them.
NUMPY_ABOVE_V3 = "X86_V4 AVX512_ICL AVX512_SPR"
# Always set, whatever the mode and processor: MKL's reproducible mode (PyTorch's CPU matrix
# products give the same floats whatever instruction set MKL finds), and no Intel SVML in
# numba (its vectorised exp, log, sin and cos differ from the C library's in the last bits).
ALWAYS = {"MKL_CBWR": "COMPATIBLE", "NUMBA_DISABLE_INTEL_SVML": "1"}
# The x86-64-v3 flags as /proc/cpuinfo spells them.
V3_FLAGS = {"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"}
NUMERIC_MODULES = ("numpy", "scipy", "torch", "numba", "sklearn")


class CodePathError(ConfigError):
    """VOICEBIAS_CODE_PATHS holds a value voicebias does not know."""


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The first processor's flags, or an empty set where /proc/cpuinfo is not readable."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def plan(
    environ: dict | os._Environ = os.environ, flags: set[str] | None = None, machine: str | None = None
) -> dict[str, str]:
    """The variables voicebias sets on this machine, in this environment."""
    mode = environ.get(MODE_VARIABLE, "avx2").strip().lower() or "avx2"
    if mode not in MODES:
        raise CodePathError(f"{MODE_VARIABLE}={environ.get(MODE_VARIABLE)!r}: use one of {', '.join(MODES)}")
    out = dict(ALWAYS)
    machine = (machine or platform.machine()).lower()
    flags = cpu_flags() if flags is None else flags
    if mode == "avx2" and machine in ("x86_64", "amd64") and V3_FLAGS <= flags:
        out.update(AVX2_PATHS)
        if "avx512f" in flags:
            out["NPY_DISABLE_CPU_FEATURES"] = NUMPY_ABOVE_V3
    return out


def apply(environ: dict | os._Environ = os.environ) -> dict[str, str]:
    """Set this machine's variables in ``environ`` (the process environment by default)."""
    try:
        wanted = plan(environ)
    except CodePathError as err:
        sys.stderr.write(f"voicebias: {err}\n")
        raise SystemExit(2) from None
    environ.update(wanted)
    return wanted


def describe() -> dict[str, object]:
    """What this process runs with, for the run's record (MLflow): the mode, the variables
    voicebias set, and the numerical modules that were loaded before it could set them
    (those kept the kernels they chose)."""
    mode = os.environ.get(MODE_VARIABLE, "avx2").strip().lower() or "avx2"
    fixed = mode == "avx2" and "OPENBLAS_CORETYPE" in APPLIED
    return {
        "mode": mode if fixed or mode == "native" else "native (no x86-64-v3)",
        "variables": dict(APPLIED),
        "loaded_before": list(LOADED_BEFORE),
    }


def identity() -> dict[str, object]:
    """What a cached computation's key carries of the code paths: the mode and the variables
    voicebias set, so a value computed under one set of kernels is not served under another."""
    d = describe()
    return {"mode": d["mode"], "variables": dict(sorted(APPLIED.items()))}


LOADED_BEFORE = tuple(m for m in NUMERIC_MODULES if m in sys.modules)
APPLIED = apply()
