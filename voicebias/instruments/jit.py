"""Compiled loops of the acoustic instrument.

The per-frame work that NumPy can only run through large temporary arrays or many small calls is
compiled by numba (`kernel`) with IEEE arithmetic: no fast-math flags, so no sum is reordered and
no multiply-add fused, and transcendental functions come from the C library. No measure goes
through a BLAS product (save the harmonicity's screening of its candidates), so the measures are
the same bits on AVX2 and AVX-512 machines. Compiled code is cached under each module's
__pycache__.

Why each choice: docs/instrument.md, "Compiled loops".
"""

from __future__ import annotations

from typing import Any, Callable

import numba


def kernel(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Compile `fn` in nopython mode with IEEE semantics (see the module docstring);
    division by zero gives inf or NaN as in NumPy instead of raising."""
    return numba.njit(cache=True, error_model="numpy", fastmath=False, nogil=True)(fn)


@kernel
def pairwise_sum(x, start, n):  # pragma: no cover - compiled
    """x[start] + ... + x[start + n - 1] added in NumPy's order for a contiguous float64
    array (eight interleaved partial sums in blocks of up to 128 values, halves added
    recursively above that), so that pairwise_sum(x, 0, n) / n is numpy.mean's float."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += x[start + i]
        return res
    if n <= 128:
        r0, r1, r2, r3 = x[start], x[start + 1], x[start + 2], x[start + 3]
        r4, r5, r6, r7 = x[start + 4], x[start + 5], x[start + 6], x[start + 7]
        i = 8
        while i < n - n % 8:
            r0 += x[start + i]
            r1 += x[start + i + 1]
            r2 += x[start + i + 2]
            r3 += x[start + i + 3]
            r4 += x[start + i + 4]
            r5 += x[start + i + 5]
            r6 += x[start + i + 6]
            r7 += x[start + i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < n:
            res += x[start + i]
            i += 1
        return res
    half = n // 2
    half -= half % 8
    return pairwise_sum(x, start, half) + pairwise_sum(x, start + half, n - half)
