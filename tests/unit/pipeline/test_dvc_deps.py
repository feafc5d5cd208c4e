"""Every module a DVC stage can import is one of its deps, so `dvc repro` never misses a change,
and the code deps in dvc.yaml are the ones `voicebias dev deps` writes (voicebias.codedeps).

The closure is static: every `import` and `from ... import` anywhere in a module (top
level and inside functions), plus lazy registry entries written as "voicebias.x:Class"
strings, followed transitively through voicebias and stages, with the package
`__init__` files each import runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from voicebias import config
from voicebias.codedeps import closure, module_file, stage_commands, uncovered, write_deps

ROOT = config.ROOT


STAGES = stage_commands(ROOT / "dvc.yaml")


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_deps_cover_its_import_closure(stage):
    module, deps = STAGES[stage]
    files = closure(module, ROOT)
    assert module_file(module, ROOT) in files, f"stage {stage}: {module} not found"
    missing = uncovered(files, deps, ROOT)
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
    files = closure(module, ROOT)
    dropped = [d for d in deps if d == "voicebias/contract.py"]
    assert dropped, "analysis must list voicebias/contract.py (its pole coding sets the odds ratio's direction)"
    assert uncovered(files, [d for d in deps if d != "voicebias/contract.py"], ROOT) == ["voicebias/contract.py"]


# Path functions of config, with the dvc.yaml placeholders they are called with.
PATH_FUNCTIONS = {
    "card_path": ("${item}",),
    "system_responses": ("${item}",),
    "responses_dir": ("${item.system}", "${item.task}"),
    "respond_report": ("${item.system}", "${item.task}"),
    "respond_reports": ("${item}",),
    "respond_planted_truth": ("${item}",),
    "scored_table": ("${item}",),
    "acoustic_table": ("${item}",),
    "continuations_dir": ("${item}",),
    "continuation_responses": ("${item}",),
    "continuation_report": ("${item}",),
    "sc_scored_table": ("${item}",),
    "continuum_responses_dir": ("${item}", "describe"),
    "continuum_respond_report": ("${item}", "describe"),
    "replicates_data": ("${item}",),
    "replicates_reports": ("${item}",),
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


def test_dvc_yaml_code_deps_are_the_generated_ones():
    """A hand edit of a stage's code deps (a file added, dropped or reordered) fails here: the
    block is what `voicebias dev deps` writes from the imports."""
    text = (ROOT / "dvc.yaml").read_text(encoding="utf-8")
    assert write_deps(text, ROOT) == text, "dvc.yaml's code deps are not the generated ones: run `voicebias dev deps`"


def mini_project(root: Path) -> None:
    (root / "stages").mkdir(parents=True)
    (root / "voicebias" / "tts").mkdir(parents=True)
    (root / "stages" / "__init__.py").write_text("")
    (root / "stages" / "make.py").write_text("from voicebias import core\n")
    (root / "voicebias" / "__init__.py").write_text("")
    (root / "voicebias" / "core.py").write_text("from voicebias.tts import engine\n")
    (root / "voicebias" / "tts" / "__init__.py").write_text("")
    (root / "voicebias" / "tts" / "engine.py").write_text("")
    (root / "voicebias" / "old.py").write_text("")


def test_the_generator_adds_new_imports_drops_stale_files_and_keeps_hand_entries(tmp_path):
    mini_project(tmp_path)
    text = (
        "stages:\n  make:\n    cmd: python -m stages.make\n    deps:\n"
        "      - voicebias/old.py\n      - stages/make.py\n      # the engine's data and code\n"
        "      - voicebias/tts\n      - data/in.csv:\n          hash: md5\n    outs:\n      - out.csv\n"
    )
    got = write_deps(text, tmp_path)
    assert got == (
        "stages:\n  make:\n    cmd: python -m stages.make\n    deps:\n"
        "      - stages/make.py\n      - stages/__init__.py\n      - voicebias/__init__.py\n      - voicebias/core.py\n"
        "      # the engine's data and code\n      - voicebias/tts\n      - data/in.csv:\n          hash: md5\n"
        "    outs:\n      - out.csv\n"
    )
    assert write_deps(got, tmp_path) == got  # generated once, stable


def test_dev_deps_check_fails_on_a_hand_edit_and_writes_the_fix(tmp_path, capsys):
    from voicebias.cli import main

    mini_project(tmp_path)
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  make:\n    cmd: python -m stages.make\n    deps:\n      - stages/make.py\n"
    )
    assert main(["dev", "deps", "--check", "--repo", str(tmp_path)]) == 1
    assert "+      - voicebias/core.py" in capsys.readouterr().out
    assert main(["dev", "deps", "--repo", str(tmp_path)]) == 0
    assert main(["dev", "deps", "--check", "--repo", str(tmp_path)]) == 0
    assert "- voicebias/tts/engine.py" in (tmp_path / "dvc.yaml").read_text()


def test_dev_deps_drops_lock_entries_of_stages_dvc_yaml_no_longer_defines(tmp_path, capsys):
    """A renamed or reshaped stage leaves its old entry in dvc.lock, which DVC parses and rewrites
    after every stage it runs: `dev deps --check` names it, `dev deps` drops it and leaves the
    other entries' bytes as DVC wrote them."""
    from voicebias.cli import main
    from voicebias.cli.dev import stale_lock_stages

    mini_project(tmp_path)
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("[core]\n    no_scm = True\n")  # what `dvc init --no-scm` writes
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n  make:\n    cmd: python -m stages.make\n    deps:\n      - stages/make.py\n"
        "      - stages/__init__.py\n      - voicebias/__init__.py\n      - voicebias/core.py\n"
        "      - voicebias/tts/__init__.py\n      - voicebias/tts/engine.py\n"
    )
    entry = (
        "  {name}:\n    cmd: python -m stages.{mod}\n    deps:\n    - path: stages/make.py\n"
        "      hash: md5\n      md5: d41d8cd98f00b204e9800998ecf8427e\n      size: 0\n"
    )
    keep = "schema: '2.0'\nstages:\n" + entry.format(name="make", mod="make")
    (tmp_path / "dvc.lock").write_text(keep + entry.format(name="make@old", mod="old"))
    assert stale_lock_stages(tmp_path) == ["make@old"]
    assert main(["dev", "deps", "--check", "--repo", str(tmp_path)]) == 1
    assert "make@old" in capsys.readouterr().out
    assert main(["dev", "deps", "--repo", str(tmp_path)]) == 0
    assert (tmp_path / "dvc.lock").read_text() == keep
    assert main(["dev", "deps", "--check", "--repo", str(tmp_path)]) == 0


def test_the_committed_lock_has_no_stale_entries():
    from voicebias.cli.dev import stale_lock_stages

    assert stale_lock_stages(ROOT) == [], "dvc.lock records stages dvc.yaml no longer defines: run `voicebias dev deps`"


def stages_depending_on(path: str) -> list[str]:
    """The stages whose dvc.yaml deps (a file or a folder above it) cover `path`: those DVC reruns
    when it changes."""
    target = (ROOT / path).resolve()
    return sorted(
        stage
        for stage, (_, deps) in STAGES.items()
        for d in deps
        if "${" not in d and ((ROOT / d).resolve() == target or (ROOT / d).resolve() in target.parents)
    )


@pytest.mark.parametrize(
    "path, stages",
    [
        # a speech-to-speech adapter: only the stages that call speech-to-speech systems (the
        # whole-run replicates call them too)
        ("voicebias/systems/vllm_omni.py", ["continuum_respond", "replicates", "respond"]),
        ("voicebias/systems/openai_audio.py", ["continuum_respond", "replicates", "respond"]),
        # a continuation adapter: only the stage that calls continuation systems
        ("voicebias/systems/spiritlm.py", ["sc_continue"]),
        # the REML fit serves both studies' analyses (the disaggregated table reads sc_stats, and the
        # replicates' cells are the disaggregated table's), nothing upstream
        ("voicebias/analysis/mixed.py", ["analysis", "disaggregate", "replicates", "sc_analysis"]),
    ],
)
def test_an_edit_reruns_only_the_stages_that_use_the_file(path, stages):
    assert stages_depending_on(path) == stages
