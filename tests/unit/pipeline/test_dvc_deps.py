"""Every module a DVC stage can import is one of its deps, so `dvc repro` never misses a change.

The closure is static: every `import` and `from ... import` anywhere in a module (top
level and inside functions), plus lazy registry entries written as "voicebias.x:Class"
strings, followed transitively through voicebias and stages, with the package
`__init__` files each import runs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from voicebias import config

ROOT = config.ROOT
LAZY = re.compile(r"^(voicebias(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?::[A-Za-z_][A-Za-z0-9_]*)?$")


def module_file(name: str, root: Path = ROOT) -> Path | None:
    base = root.joinpath(*name.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def imported_names(path: Path) -> set[str]:
    """Module names `path` can import (for `from a import b`, both a and a.b)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = LAZY.match(node.value)
            if m:
                names.add(m.group(1))
    return names


def closure(start: str, root: Path = ROOT) -> set[Path]:
    """Files of every project module reachable from module `start` (package __init__ files included)."""
    seen: set[Path] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name.split(".")[0] not in ("voicebias", "stages"):
            continue
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ first
            f = module_file(".".join(parts[:i]), root)
            if f is None or f in seen:
                continue
            seen.add(f)
            todo.extend(imported_names(f))
    return seen


def stage_commands(dvc_yaml: Path = ROOT / "dvc.yaml") -> dict[str, tuple[str, list[str]]]:
    """stage name -> (module its cmd runs, deps as written)."""
    spec = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"]
    out = {}
    for name, st in spec.items():
        body = st.get("do", st)
        m = re.search(r"python -m ([\w.]+)", body["cmd"])
        assert m, f"stage {name}: cmd does not run a module: {body['cmd']}"
        out[name] = (m.group(1), [str(d) if isinstance(d, str) else next(iter(d)) for d in body.get("deps", [])])
    return out


def uncovered(files: set[Path], deps: list[str], root: Path = ROOT) -> list[str]:
    dep_paths = [(root / d).resolve() for d in deps if "${" not in d]
    missing = []
    for f in sorted(files):
        f = f.resolve()
        if not any(f == d or d in f.parents for d in dep_paths):
            missing.append(str(f.relative_to(root)))
    return missing


STAGES = stage_commands()


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_deps_cover_its_import_closure(stage):
    module, deps = STAGES[stage]
    files = closure(module)
    assert module_file(module) in files, f"stage {stage}: {module} not found"
    missing = uncovered(files, deps)
    assert not missing, f"stage {stage} can import modules its dvc.yaml deps do not list: {missing}"


def test_closure_follows_function_level_and_lazy_registry_imports(tmp_path):
    pkg = tmp_path / "voicebias"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("REG = {'x': 'voicebias.sub.lazy:Thing'}\n")
    (pkg / "sub" / "lazy.py").write_text("class Thing: ...\n")
    (pkg / "inner.py").write_text("def f():\n    from voicebias import deep\n    return deep\n")
    (pkg / "deep.py").write_text("import os\n")
    (pkg / "top.py").write_text("import voicebias.inner\nfrom voicebias.sub import REG\n")
    got = {str(p.relative_to(tmp_path)) for p in closure("voicebias.top", tmp_path)}
    assert got == {
        "voicebias/__init__.py",
        "voicebias/top.py",
        "voicebias/inner.py",
        "voicebias/deep.py",
        "voicebias/sub/__init__.py",
        "voicebias/sub/lazy.py",
    }
    assert uncovered(
        closure("voicebias.top", tmp_path),
        ["voicebias/top.py", "voicebias/inner.py", "voicebias/__init__.py", "voicebias/sub"],
        tmp_path,
    ) == ["voicebias/deep.py"]


def test_dropping_one_module_from_a_stage_is_caught():
    module, deps = STAGES["analysis"]
    files = closure(module)
    dropped = [d for d in deps if d == "voicebias/contract.py"]
    assert dropped, "analysis must list voicebias/contract.py (its pole coding sets the odds ratio's direction)"
    assert uncovered(files, [d for d in deps if d != "voicebias/contract.py"]) == ["voicebias/contract.py"]


# Path functions of config, with the dvc.yaml placeholders they are called with.
PATH_FUNCTIONS = {
    "card_path": ("${item}",),
    "system_responses": ("${item}",),
    "responses_dir": ("${item.system}", "${item.task}"),
    "respond_report": ("${item.system}", "${item.task}"),
    "respond_reports": ("${item}",),
    "scored_table": ("${item}",),
    "acoustic_table": ("${item}",),
    "continuations_dir": ("${item}",),
    "continuation_responses": ("${item}",),
    "continuation_report": ("${item}",),
    "sc_scored_table": ("${item}",),
}


def config_paths() -> set[str]:
    """Every path config defines, relative to the root: the constants and the path
    functions called with the placeholders of dvc.yaml's foreach stages."""
    paths = {v for k, v in vars(config).items() if k.isupper() and isinstance(v, Path)}
    paths |= {getattr(config, name)(*args) for name, args in PATH_FUNCTIONS.items()}
    return {str(p.relative_to(ROOT)) for p in paths if p.is_relative_to(ROOT)}


def stage_paths() -> list[tuple[str, str]]:
    """(stage, path) of every out and every data dep (code deps aside) in dvc.yaml."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    pairs = []
    for name, st in stages.items():
        st = st.get("do", st)
        entries = [*st.get("deps", []), *st.get("outs", []), *st.get("metrics", []), *st.get("plots", [])]
        for e in entries:
            path = e if isinstance(e, str) else next(iter(e))
            if not path.startswith(("voicebias/", "stages/")):
                pairs.append((name, path))
    return pairs


def test_every_path_of_dvc_yaml_is_defined_in_config():
    """A data dep or out of a stage is a path config defines, or a file directly inside
    one (a stage's named outputs in its report folder), so a path is written once."""
    defined = config_paths()
    bad = [(s, p) for s, p in stage_paths() if p not in defined and str(Path(p).parent) not in defined]
    assert not bad, bad


def test_config_path_functions_are_listed_here():
    funcs = {
        n
        for n, v in vars(config).items()
        if callable(v)
        and getattr(v, "__module__", "") == config.__name__
        and not n.startswith("_")
        and n != "find_root"
    }
    assert funcs == set(PATH_FUNCTIONS)


def test_stage_scripts_take_every_path_from_config():
    """stages/*.py join no path themselves: no `/ "name"` after a config path."""
    joins = re.compile(r"""config\.[A-Za-z_]+(\([^)]*\))?\s*/\s*f?["']""")
    bad = [p.name for p in (ROOT / "stages").glob("*.py") if joins.search(p.read_text(encoding="utf-8"))]
    assert not bad, bad
