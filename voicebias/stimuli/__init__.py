"""Stimuli: the passage bank and its extension, voiced passages, continuation prompts and their
phonation conversions."""
