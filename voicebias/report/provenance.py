"""Provenance of a run for the audit card: what was audited, never when.

Every value is a fact of the stage's inputs: the sha256 of the stimulus manifest, each
system's checkpoint and revision from its card, and the seeds from params.yaml. The card is a
tracked output, so it holds neither the time nor the git commit (which is not an input: a
fresh clone at the commit of the outputs would write another card); the commit of a run is
on its MLflow parent run (tag voicebias.git_commit).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml


def file_sha256(path: Path) -> str | None:
    """sha256 of a file's bytes; None when it is absent."""
    path = Path(path)
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def model_revisions(cards_dir: Path, systems: list[str]) -> dict[str, dict[str, Any]]:
    """checkpoint and revision of each system from models/cards/<system>.yaml (None where a card lacks one)."""
    out = {}
    for system in systems:
        card_file = Path(cards_dir) / f"{system}.yaml"
        card = yaml.safe_load(card_file.read_text(encoding="utf-8")) if card_file.is_file() else {}
        card = card or {}
        out[system] = {"checkpoint": card.get("checkpoint"), "revision": card.get("revision")}
    return out


def seeds(params: dict[str, Any]) -> dict[str, Any]:
    """The run's seeds: params base.seed."""
    return {"base.seed": (params.get("base") or {}).get("seed")}


def collect_provenance(root: Path, params: dict[str, Any], manifest: Path, cards_dir: Path) -> dict[str, Any]:
    """The card's provenance dict for the systems of params run.systems and run.sc_systems."""
    run = params.get("run") or {}
    systems = list(dict.fromkeys([*(run.get("systems") or []), *(run.get("sc_systems") or [])]))
    return {
        "stimulus_set_sha256": file_sha256(manifest),
        "model_revisions": model_revisions(cards_dir, systems),
        "seeds": seeds(params),
    }
