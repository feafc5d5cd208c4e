"""Scoring of system outputs: text (describe words, pronouns), acoustics (output minus input, text
control) and continuations."""
