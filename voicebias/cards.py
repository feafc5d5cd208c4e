"""System cards: models/cards/<name>.yaml names each system exactly.

A card records what the audit needs to name the system: `adapter`, `checkpoint`,
`revision`, `output_voice` (per language), `licence` and `memory`, plus optional
`requires` (env / gpu / checkout / weights) read by the preflight, an optional
`weights` list of the Hugging Face hub repositories `voicebias fetch` downloads
(see :func:`validate_weights`) and an optional dated `pricing` table
(:func:`voicebias.cost.validate_pricing`). docs/extending/system.md shows a whole card.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from typing import Any

from voicebias.config import CARDS_DIR
from voicebias.errors import ConfigError
from voicebias.io import read_yaml

CARD_KEYS = ("adapter", "checkpoint", "revision", "output_voice", "licence", "memory")

#: keys of one entry of a card's `weights` list
WEIGHT_KEYS = ("repo_id", "revision", "pinned", "subdir", "files", "allow_patterns", "sha256")
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _relative(value: Any, what: str) -> str:
    """`value` as a relative POSIX path that stays inside its folder (no '..', not absolute)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} must be a non-empty relative path, not {value!r}")
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts or "\\" in value:
        raise ConfigError(f"{what} must be a relative path inside the folder, not {value!r}")
    return str(path)


def validate_weights(entries: Any, where: str) -> list[dict[str, Any]]:
    """The card's `weights` list, checked and normalised; a malformed entry raises ConfigError naming it.

    Each entry names one hub repository:

    ``repo_id``         owner/name on the Hugging Face hub (required)
    ``revision``        the commit (40 hex digits), branch or tag to download (required)
    ``pinned``          whether `revision` is a commit: true by default for a 40-hex commit;
                        a branch or tag needs an explicit `pinned: false` (`pinned: true` with
                        anything but a commit is refused). `voicebias fetch` warns about every
                        entry that is not pinned.
    ``subdir``          where the repository goes inside the system's weights folder
                        (default: the folder itself)
    ``files``           the files to download (default: the whole repository) ...
    ``allow_patterns``  ... or glob patterns choosing them (not both)
    ``sha256``          {file: sha256}: files refused unless their contents hash to this
    """
    if entries is None:
        return []
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: 'weights' must be a list of hub repositories (repo_id, revision, ...)")
    out = []
    for i, entry in enumerate(entries):
        at = f"{where}: weights[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{at} must be a mapping with repo_id and revision, not {entry!r}")
        unknown = sorted(set(entry) - set(WEIGHT_KEYS))
        if unknown:
            raise ConfigError(f"{at} has unknown key(s) {unknown}; allowed: {', '.join(WEIGHT_KEYS)}")
        repo_id = entry.get("repo_id")
        if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id):
            raise ConfigError(f"{at}: repo_id must be a hub id 'owner/name', not {repo_id!r}")
        at = f"{at} ({repo_id})"
        revision = entry.get("revision")
        if not isinstance(revision, str) or not revision.strip() or any(c.isspace() for c in revision):
            raise ConfigError(f"{at}: revision must be a commit (40 hex digits), branch or tag, not {revision!r}")
        is_commit = bool(_COMMIT.match(revision))
        if "pinned" not in entry and not is_commit:
            raise ConfigError(
                f"{at}: revision {revision!r} is not a commit (40 lowercase hex digits); pin one, or "
                "write pinned: false to fetch whatever the branch or tag holds (fetch warns)"
            )
        pinned = entry.get("pinned", is_commit)
        if not isinstance(pinned, bool):
            raise ConfigError(f"{at}: pinned must be true or false, not {pinned!r}")
        if pinned and not is_commit:
            raise ConfigError(
                f"{at}: pinned: true needs revision to be a full commit hash (40 lowercase hex "
                f"digits), not {revision!r}; write pinned: false for a branch or tag"
            )
        norm: dict[str, Any] = {"repo_id": repo_id, "revision": revision, "pinned": pinned}
        if entry.get("subdir") is not None:
            norm["subdir"] = _relative(entry["subdir"], f"{at}: subdir")
        if entry.get("files") is not None and entry.get("allow_patterns") is not None:
            raise ConfigError(f"{at}: give files or allow_patterns, not both")
        for key in ("files", "allow_patterns"):
            value = entry.get(key)
            if value is None:
                continue
            if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
                raise ConfigError(f"{at}: {key} must be a non-empty list of strings, not {value!r}")
            norm[key] = [_relative(v, f"{at}: {key}") for v in value] if key == "files" else list(value)
        sums = entry.get("sha256")
        if sums is not None:
            if not isinstance(sums, dict) or not sums:
                raise ConfigError(f"{at}: sha256 must map file names to their sha256 (64 hex digits)")
            checked = {}
            for name, digest in sums.items():
                name = _relative(name, f"{at}: sha256 key")
                if not isinstance(digest, str) or not _SHA256.match(digest.lower()):
                    raise ConfigError(f"{at}: sha256 of {name} must be 64 hex digits, not {digest!r}")
                if "files" in norm and name not in norm["files"]:
                    raise ConfigError(f"{at}: sha256 names {name}, which is not in its files")
                checked[name] = digest.lower()
            norm["sha256"] = checked
        out.append(norm)
    return out


def load_card(name: str, cards_dir: Path = CARDS_DIR) -> dict[str, Any]:
    """Read models/cards/<name>.yaml and check it names the system completely."""
    path = Path(cards_dir) / f"{name}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"no system card for '{name}' (expected {path})")
    card = read_yaml(path)
    if not isinstance(card, dict):
        raise ConfigError(f"system card {path} does not hold a mapping")
    for key in CARD_KEYS:
        if key not in card:
            raise ConfigError(f"system card {path} lacks '{key}'")
    if "weights" in card:
        card["weights"] = validate_weights(card["weights"], f"system card {path}")
    if "pricing" in card:
        from voicebias.cost import validate_pricing

        card["pricing"] = validate_pricing(card["pricing"], f"system card {path}")
    return card
