"""voicebias: a reproducible audit pipeline for gender bias in speech models."""

import os

# Intel MKL's Conditional Numerical Reproducibility mode: PyTorch's CPU matrix products
# (the speaker encoders, the classifiers on a machine without a GPU) give the same floats
# on every x86-64 processor, where MKL would otherwise pick its code path, and with it the
# rounding, by instruction set (an AVX-512 and an AVX2 machine differ by about 1e-7 in a
# Resemblyzer embedding). MKL reads it at its first call; a value the user set wins.
os.environ.setdefault("MKL_CBWR", "COMPATIBLE")
# numba would call Intel's SVML for vectorised exp, log, sin and cos where it is installed
# (icc_rt), whose results differ from the C library's in the last bits; the C library
# keeps the acoustic instrument's compiled loops (voicebias.instruments.jit) to the same
# bits on every machine. numba reads it when it loads; a value the user set wins.
os.environ.setdefault("NUMBA_DISABLE_INTEL_SVML", "1")

__version__ = "0.1.0"
