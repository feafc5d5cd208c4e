"""voicebias: a reproducible audit pipeline for gender bias in speech models."""

__version__ = "0.1.0"
