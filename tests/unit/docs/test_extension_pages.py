"""The extension pages (docs/extending/) name only things that exist: every file path, every
dotted module path, every constant and class named in capitals, and every `name` said to be
in `a file`. A page that names a renamed or removed symbol fails here, so the pages cannot
go stale silently. Code blocks are examples (they create new files and names) and are not read."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from voicebias import config

ROOT = config.ROOT
PAGES = sorted((ROOT / "docs" / "extending").glob("*.md"))
#: the files each page's worked example creates
NEW_FILES = {
    "voicebias/instruments/level.py",
    "voicebias/systems/echo_reference.py",
    "models/cards/echo_reference.yaml",
    "tests/unit/systems/test_echo_reference.py",
}
PATH = re.compile(r"^(voicebias|tests|docs|stages|data|models|profiles|benchmarks)/[\w./-]*$")
DOTTED = re.compile(r"^voicebias(\.[A-Za-z_]\w*)+$")
#: constants (ALL_CAPS) and classes with two or more capitals (MeasureSettings, S2SSystem), possibly with
#: an attribute; single-capital words (Examples, Rscript, Literal) are prose or other programs
CAPITALISED = re.compile(r"^(?:_?[A-Z][A-Z0-9_]{2,}|_?[A-Z][a-z0-9]*[A-Z][A-Za-z0-9]*)(?:\.[A-Za-z_]\w*)?$")
IN_FILE = re.compile(r"`([A-Za-z_][\w.]*)(?:\(\))?` in `([\w/.-]+\.py)`")


def prose(page: Path) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)


def tokens(page: Path) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(page))


def defined(name: str, text: str) -> bool:
    return bool(re.search(rf"^\s*(?:def|class)\s+{re.escape(name)}\b|^\s*{re.escape(name)}\s*[:=]", text, re.M))


SOURCES = "\n".join(
    p.read_text(encoding="utf-8") for d in ("voicebias", "tests") for p in sorted((ROOT / d).rglob("*.py"))
)
#: pipeline outputs a page may name: DVC writes them, a fresh checkout does not hold them
OUTPUTS = ("data/", "reports/")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_a_page_names_exists(page):
    paths = [t.rstrip("/") for t in tokens(page) if PATH.match(t)]
    assert paths
    dvc = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    missing = [
        p
        for p in paths
        if p not in NEW_FILES and not (ROOT / p).exists() and not (p.startswith(OUTPUTS) and p.split("/")[1] in dvc)
    ]
    assert not missing, f"{page.name} names missing files: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_module_path_a_page_names_imports(page):
    for dotted in (t for t in tokens(page) if DOTTED.match(t)):
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ModuleNotFoundError:
                continue
            for attr in parts[i:]:
                assert hasattr(obj, attr), f"{page.name}: {dotted} ({attr} is not in {obj.__name__})"
                obj = getattr(obj, attr)
            break
        else:
            pytest.fail(f"{page.name}: {dotted} is no module")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_capitalised_name_a_page_gives_is_defined_in_the_code(page):
    names = {t.split(".")[0] for t in tokens(page) if CAPITALISED.match(t)}
    missing = sorted(n for n in names if not defined(n, SOURCES))
    assert not missing, f"{page.name} names what the package does not define: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_name_said_to_be_in_a_file_is_there(page):
    for name, path in IN_FILE.findall(prose(page)):
        if path in NEW_FILES:
            continue
        text = (ROOT / path).read_text(encoding="utf-8")
        first = name.split(".")[0]
        assert defined(first, text), f"{page.name}: `{name}` is not in {path}"


def test_the_checks_catch_a_stale_name(tmp_path):
    page = tmp_path / "stale.md"
    page.write_text("Add one line to `ADAPTERS_OLD` and edit `nothing_here` in `voicebias/contract.py`.\n")
    assert [t for t in tokens(page) if CAPITALISED.match(t)] == ["ADAPTERS_OLD"]
    assert not defined("ADAPTERS_OLD", SOURCES)
    assert IN_FILE.findall(prose(page)) == [("nothing_here", "voicebias/contract.py")]
    assert not defined("nothing_here", (ROOT / "voicebias/contract.py").read_text(encoding="utf-8"))
