"""Instruments: acoustic measures, voice quality, gender classifiers, the composite, speaker embeddings,
ASR and the continuation judge."""
