"""What an AVX2-only x86-64 machine would compute, on an AVX-512 one: the environment
that keeps oneDNN, PyTorch's own kernels, NumPy, OpenBLAS and numba's compiled code to
their AVX2 paths, for tests that compare a process run with it against a native one."""

from __future__ import annotations

import pytest

from voicebias.codepaths import AVX2_PATHS, MODE_VARIABLE, NUMPY_ABOVE_V3, cpu_flags

# Both arms of a comparison run with VOICEBIAS_CODE_PATHS=native, so that voicebias does not
# fix the paths itself (voicebias.codepaths) and the arms take the kernels named here.
NATIVE = {MODE_VARIABLE: "native"}
AVX2_CODE_PATHS = {**NATIVE, **AVX2_PATHS, "NPY_DISABLE_CPU_FEATURES": NUMPY_ABOVE_V3}


def require_avx512() -> None:
    """Skip the calling test on a CPU without both AVX-512 and AVX2."""
    flags = cpu_flags()
    if "avx512f" not in flags or "avx2" not in flags:
        pytest.skip("needs an x86-64 CPU with AVX-512 to compare its code paths with AVX2's")
