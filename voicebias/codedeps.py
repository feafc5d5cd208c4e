"""The code deps of each DVC stage, computed from the imports: `voicebias dev deps` writes them.

A stage's code deps are the files of every project module its command can import: every
`import` and `from ... import` anywhere in a module (top level and inside functions), plus
lazy registry entries written as "voicebias.x:Class" strings, followed transitively through
voicebias and stages, with the package `__init__` files each import runs. `dvc.yaml` lists
them so that `dvc repro` reruns a stage when any of them changes; `write_deps` rewrites each
stage's `.py` entries from the imports and keeps every other entry (data, params, folders
such as `voicebias/tts`, whose files then need no entry of their own) where it is.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

from voicebias.errors import ConfigError

LAZY = re.compile(r"^(voicebias(?:\.[A-Za-z_][A-Za-z0-9_]*)+)(?::[A-Za-z_][A-Za-z0-9_]*)?$")
#: a code dep dvc.yaml lists file by file (generated); other entries are written by hand
CODE_FILE = re.compile(r"^(stages|voicebias)/[^$]*\.py$")
PACKAGES = ("voicebias", "stages")


def module_file(name: str, root: Path) -> Path | None:
    """The file of module `name` under `root` (a module's .py or a package's __init__.py), or None."""
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


def closure(start: str, root: Path) -> set[Path]:
    """Files of every project module reachable from module `start` (package __init__ files included)."""
    seen: set[Path] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name.split(".")[0] not in PACKAGES:
            continue
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ first
            f = module_file(".".join(parts[:i]), root)
            if f is None or f in seen:
                continue
            seen.add(f)
            todo.extend(imported_names(f))
    return seen


def stage_commands(dvc_yaml: Path) -> dict[str, tuple[str, list[str]]]:
    """stage name -> (module its cmd runs, deps as written)."""
    spec = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"]
    out = {}
    for name, st in spec.items():
        body = st.get("do", st)
        m = re.search(r"python -m ([\w.]+)", body["cmd"])
        if not m:
            raise ConfigError(f"dvc.yaml: stage {name}: cmd does not run a module (python -m ...): {body['cmd']}")
        out[name] = (m.group(1), [str(d) if isinstance(d, str) else next(iter(d)) for d in body.get("deps", [])])
    return out


def uncovered(files: set[Path], deps: list[str], root: Path) -> list[str]:
    """Files among `files` that no entry of `deps` (a file or a folder above it) covers."""
    dep_paths = [(root / d).resolve() for d in deps if "${" not in d]
    missing = []
    for f in sorted(files):
        f = f.resolve()
        if not any(f == d or d in f.parents for d in dep_paths):
            missing.append(str(f.relative_to(root.resolve())))
    return missing


def code_deps(module: str, kept: list[str], root: Path) -> list[str]:
    """The file entries of a stage running `module`: its own file and stages/__init__.py first,
    then every other file of its import closure in sorted order, leaving out files under a
    folder among `kept` (the entries written by hand)."""
    files = closure(module, root)
    own = module_file(module, root)
    if own is None:
        raise ConfigError(f"dvc.yaml: module {module} (a stage's `python -m`) not found under {root}")
    rest = uncovered(files, kept, root)
    first = [str(own.relative_to(root))]
    if "stages/__init__.py" in rest and first[0] != "stages/__init__.py":
        first.append("stages/__init__.py")
    return first + sorted(set(rest) - set(first))


DEPS_LINE = re.compile(r"^(?P<indent>\s*)deps:\s*$")


def write_deps(text: str, root: Path) -> str:
    """`text` (dvc.yaml) with each stage's code-file deps rewritten from its imports; every other
    line (other deps, comments, params, outs) as it was."""
    try:
        yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"dvc.yaml is not valid YAML: {' '.join(str(err).split())}") from None
    lines = text.split("\n")
    out: list[str] = []
    stage = module = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m_stage = re.match(r"^  ([A-Za-z0-9_-]+):\s*$", line)
        if m_stage:
            stage, module = m_stage.group(1), None
        m_cmd = re.search(r"cmd:\s*python -m ([\w.]+)", line)
        if m_cmd:
            module = m_cmd.group(1)
        m = DEPS_LINE.match(line)
        if not m:
            out.append(line)
            i += 1
            continue
        if module is None:
            raise ConfigError(f"dvc.yaml: stage {stage}: deps before a `cmd: python -m` line")
        out.append(line)
        i += 1
        entries: list[tuple[str, list[str]]] = []  # (dep, its lines: the entry and any nested or comment lines)
        item_indent = None
        while i < len(lines):
            cur = lines[i]
            stripped = cur.strip()
            ind = len(cur) - len(cur.lstrip())
            if stripped.startswith("- ") and (item_indent is None or ind == item_indent):
                item_indent = ind
                entries.append((stripped[2:].rstrip(":").strip(), [cur]))
            elif stripped and item_indent is not None and ind > item_indent:
                entries[-1][1].append(cur)  # options of the entry above
            elif stripped.startswith("#") and item_indent is not None and ind >= item_indent:
                entries.append(("#", [cur]))
            else:
                break
            i += 1
        kept = [e for e in entries if not CODE_FILE.match(e[0])]
        generated = code_deps(module, [d for d, _ in kept if d != "#"], root)
        pad = " " * (item_indent if item_indent is not None else len(m.group("indent")) + 2)
        out.extend(f"{pad}- {d}" for d in generated)
        for _, block in kept:
            out.extend(block)
    return "\n".join(out)
