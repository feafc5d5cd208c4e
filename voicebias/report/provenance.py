"""Provenance of a run for the audit card: what was audited, never when.

Every value is a fact of the checkout and its inputs: the git commit (read from .git's files,
no git process and no clock), the sha256 of the stimulus manifest, each system's checkpoint
and revision from its card, and the seeds from params.yaml. Nothing here reads the time.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml


def _git_dir(root: Path) -> Path | None:
    """The repository's git directory: .git itself, or the folder a worktree's .git file points to."""
    dot = Path(root) / ".git"
    if dot.is_dir():
        return dot
    if dot.is_file():
        text = dot.read_text(encoding="utf-8").strip()
        if text.startswith("gitdir:"):
            d = Path(text[len("gitdir:"):].strip())
            return d if d.is_absolute() else (Path(root) / d).resolve()
    return None


def _resolve_ref(git_dir: Path, ref: str) -> str | None:
    common = git_dir
    if (git_dir / "commondir").is_file():
        c = Path((git_dir / "commondir").read_text(encoding="utf-8").strip())
        common = c if c.is_absolute() else (git_dir / c).resolve()
    for d in dict.fromkeys((git_dir, common)):
        f = d / ref
        if f.is_file():
            return f.read_text(encoding="utf-8").strip() or None
    for d in dict.fromkeys((git_dir, common)):
        packed = d / "packed-refs"
        if packed.is_file():
            for line in packed.read_text(encoding="utf-8").splitlines():
                parts = line.split()
                if len(parts) == 2 and not line.startswith(("#", "^")) and parts[1] == ref:
                    return parts[0]
    return None


def git_commit(root: Path) -> str | None:
    """The commit HEAD names (detached HEAD, a loose ref or a packed ref); None outside a git checkout."""
    git_dir = _git_dir(root)
    if git_dir is None or not (git_dir / "HEAD").is_file():
        return None
    head = (git_dir / "HEAD").read_text(encoding="utf-8").strip()
    if head.startswith("ref:"):
        return _resolve_ref(git_dir, head[len("ref:"):].strip())
    return head or None


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
    return {"git_commit": git_commit(root), "stimulus_set_sha256": file_sha256(manifest),
            "model_revisions": model_revisions(cards_dir, systems), "seeds": seeds(params)}
