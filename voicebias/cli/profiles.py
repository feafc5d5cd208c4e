"""Profiles: the embedded default and the paper profile, selected with one command.

`profiles/embedded.yaml` is the complete embedded default; other profiles hold
overrides merged on top of it. `voicebias profile NAME` writes the result to
params.yaml, which is what `dvc repro` reads.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from voicebias.config import PARAMS, PROFILES_DIR
from voicebias.io import read_yaml

MERGE_REPLACES = {"voices", "systems", "classifier_weights"}  # mappings replaced whole, not merged


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k not in MERGE_REPLACES:
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def available_profiles(profiles_dir: Path = PROFILES_DIR) -> list[str]:
    return sorted(p.stem for p in Path(profiles_dir).glob("*.yaml"))


def resolve_profile(name: str, profiles_dir: Path = PROFILES_DIR) -> dict[str, Any]:
    path = Path(profiles_dir) / f"{name}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"no profile '{name}'; available: {', '.join(available_profiles(profiles_dir))}")
    base = read_yaml(Path(profiles_dir) / "embedded.yaml")
    if name == "embedded":
        return base
    return deep_merge(base, read_yaml(path) or {})


def write_profile(name: str, params_path: Path = PARAMS, profiles_dir: Path = PROFILES_DIR) -> Path:
    """Write the resolved profile to params.yaml (the embedded profile is copied verbatim)."""
    if name == "embedded":
        params_path.write_text((Path(profiles_dir) / "embedded.yaml").read_text(encoding="utf-8"), encoding="utf-8")
        return params_path
    params = resolve_profile(name, profiles_dir)
    header = (
        f"# voicebias parameters: profile '{name}' (profiles/{name}.yaml merged over profiles/embedded.yaml).\n"
        "# Written by `voicebias profile`; `voicebias profile embedded` restores the default.\n"
    )
    params_path.write_text(header + yaml.safe_dump(params, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return params_path
