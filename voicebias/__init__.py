"""voicebias: a reproducible audit pipeline for gender bias in speech models."""

# Fix the numerical libraries' code paths before any of them loads (see voicebias.codepaths):
# the same bytes on every x86-64-v3 machine, Intel or AMD, AVX2 or AVX-512.
from voicebias import codepaths as _codepaths  # noqa: F401

__version__ = "0.1.0"
