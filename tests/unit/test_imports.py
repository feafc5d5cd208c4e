"""No import cycle among voicebias modules (imports at top level and inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

from voicebias import config
from voicebias.codedeps import module_file

ROOT = config.ROOT


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    mods = {}
    for p in sorted((root / "voicebias").rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def import_edges(path: Path, known: dict[str, Path], me: str) -> set[str]:
    """Project modules `path` imports with an import statement (any depth), itself excluded."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        out.update(n for n in names if n in known and n != me)
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_sees_function_level_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_module_file_and_modules_agree():
    mods = project_modules()
    assert mods["voicebias.instruments.acoustics"] == module_file("voicebias.instruments.acoustics", config.ROOT)


KNOWN: list[list[str]] = []  # no cycle is tolerated


def test_no_import_cycle_among_voicebias_modules():
    mods = project_modules()
    edges = {m: import_edges(p, mods, m) for m, p in mods.items()}
    assert (
        "voicebias.instruments.classifiers" not in edges["voicebias.instruments.acoustics"]
        or "voicebias.instruments.acoustics" not in edges["voicebias.instruments.classifiers"]
    )
    assert [c for c in cycles(edges) if c not in KNOWN] == []


#: the layers, bottom first: a package imports only from layers below its own (the modules
#: directly under voicebias/, such as config, errors, io, are the core beneath them all)
LAYERS = [
    ["core"],
    ["clients"],
    ["tts"],
    ["instruments"],
    ["stimuli"],
    ["systems", "serving"],
    ["gates", "scoring"],
    ["analysis"],
    ["report"],
    ["pipeline"],
    ["cli"],
]
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (ROOT / "voicebias" / parts[1]).is_dir()) else "core"


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """Imports that point up, or sideways into another package of the same layer."""
    bad = []
    for src, targets in sorted(edges.items()):
        for dst in sorted(targets):
            a, b = package_of(src), package_of(dst)
            if a != b and RANK[b] >= RANK[a]:
                bad.append(f"{src} ({a}) imports {dst} ({b})")
    return bad


def test_every_package_has_a_layer():
    packages = {p.name for p in (ROOT / "voicebias").iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(RANK) - {"core"}


def test_dependencies_point_down_the_layers():
    """core < clients < tts < instruments < stimuli < systems, serving < gates, scoring < analysis
    < report < pipeline < cli: no package imports from its own layer or above (so no package
    cycle), at top level or inside a function."""
    mods = project_modules()
    edges = {m: import_edges(p, mods, m) for m, p in mods.items()}
    assert upward_imports(edges) == []


def test_an_upward_import_is_caught():
    edges = {"voicebias.instruments.judge": {"voicebias.stimuli.generate"}, "voicebias.io": set()}
    assert upward_imports(edges) == [
        "voicebias.instruments.judge (instruments) imports voicebias.stimuli.generate (stimuli)"
    ]
