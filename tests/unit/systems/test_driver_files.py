"""Driver scripts run as `python <driver file>`, so their own folder comes first on sys.path:
a driver or helper module named like a package it imports would import itself instead
(e.g. a file spiritlm.py doing `from spiritlm.model... import`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import voicebias

PACKAGE = Path(voicebias.__file__).resolve().parent
SCRIPT_FOLDERS = [PACKAGE / "systems" / "drivers", PACKAGE / "external"]
SCRIPTS = sorted(p for folder in SCRIPT_FOLDERS for p in folder.glob("*.py") if p.name != "__init__.py")


def imported_top_levels(path: Path) -> set[str]:
    """Top-level names of every absolute import in the file, wherever it appears."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_script_folders_hold_drivers():
    assert len(SCRIPTS) >= 6, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_script_is_named_like_a_package_it_imports(script):
    own = {p.stem for p in script.parent.glob("*.py")}
    clashes = sorted(own & imported_top_levels(script) - {"_protocol"})
    assert not clashes, (
        f"{script.name} imports {clashes}, which its folder shadows when it runs as a script; "
        "rename the file in that folder"
    )
