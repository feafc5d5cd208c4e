"""What an AVX2-only x86-64 machine would compute, on an AVX-512 one: the environment
that keeps oneDNN, PyTorch's own kernels, NumPy, OpenBLAS and numba's compiled code to
their AVX2 paths, for tests that compare a process run with it against a native one."""

from __future__ import annotations

from pathlib import Path

import pytest

# Both arms of a comparison run with VOICEBIAS_CODE_PATHS=native, so that voicebias does not
# fix the paths itself (voicebias.codepaths) and the arms take the kernels named here.
NATIVE = {"VOICEBIAS_CODE_PATHS": "native"}
AVX2_CODE_PATHS = {
    **NATIVE, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "OPENBLAS_CORETYPE": "Haswell",
    "NUMBA_CPU_NAME": "haswell",
    # NumPy 2's names for its dispatch targets above x86-64-v3
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
}


def require_avx512() -> None:
    """Skip the calling test on a CPU without both AVX-512 and AVX2."""
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    if "avx512f" not in flags or "avx2" not in flags:
        pytest.skip("needs an x86-64 CPU with AVX-512 to compare its code paths with AVX2's")
