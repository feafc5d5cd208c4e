"""Shared fixtures of the system adapter tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_endpoints_file(tmp_path, monkeypatch):
    """Keep a developer's own .cache/endpoints.json (written by `voicebias serve`) out of these tests."""
    monkeypatch.setenv("VOICEBIAS_ENDPOINTS", str(tmp_path / "no-endpoints.json"))
