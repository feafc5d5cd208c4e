"""`voicebias dev deps [--check]`: write (or check) the code deps of every stage in dvc.yaml, and
drop dvc.lock's entries for stages dvc.yaml no longer defines."""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

import yaml


def stale_lock_stages(root: Path) -> list[str]:
    """Names of the stages dvc.lock records that dvc.yaml (with params.yaml's foreach lists) no
    longer defines. DVC keeps such entries when a stage is renamed or reshaped, and parses and
    rewrites the whole lock file after every stage it runs, so they cost time on every run."""
    from dvc.repo import Repo

    lock = Path(root) / "dvc.lock"
    if not lock.is_file():
        return []
    recorded = (yaml.safe_load(lock.read_text(encoding="utf-8")) or {}).get("stages") or {}
    with Repo(str(root)) as repo:
        defined = {s.name for s in repo.index.stages}
    return sorted(name for name in recorded if name not in defined)


def prune_lock(root: Path) -> list[str]:
    """Remove the stale entries (`stale_lock_stages`) from dvc.lock with DVC's own serializer, so
    every other entry keeps its bytes; returns the names removed."""
    from dvc.utils.serialize import modify_yaml

    stale = stale_lock_stages(root)
    if stale:
        with modify_yaml(Path(root) / "dvc.lock") as data:
            for name in stale:
                del data["stages"][name]
    return stale


def cmd_deps(args: argparse.Namespace) -> int:
    from voicebias.codedeps import write_deps

    repo = Path(args.repo).resolve()
    path = repo / "dvc.yaml"
    text = path.read_text(encoding="utf-8")
    new = write_deps(text, repo)
    stale = stale_lock_stages(repo)
    if args.check:
        if new != text:
            sys.stdout.writelines(
                difflib.unified_diff(text.splitlines(True), new.splitlines(True), "dvc.yaml", "dvc.yaml (generated)")
            )
            print("dvc.yaml: the code deps differ from the stages' imports; run `voicebias dev deps` to write them")
        if stale:
            print(
                f"dvc.lock: entries for stages dvc.yaml does not define: {', '.join(stale)}; "
                "`voicebias dev deps` drops them"
            )
        if new == text and not stale:
            print("dvc.yaml: every stage's code deps are its imports; dvc.lock: no stale entries")
            return 0
        return 1
    if new == text:
        print("dvc.yaml: every stage's code deps are its imports")
    else:
        path.write_text(new, encoding="utf-8")
        print("dvc.yaml: code deps written from the stages' imports")
    if stale:
        prune_lock(repo)
        print(f"dvc.lock: dropped the entries of {len(stale)} stages dvc.yaml no longer defines: {', '.join(stale)}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `dev` (maintainer commands) on the command's subparsers."""
    p = sub.add_parser("dev", help="maintainer commands: deps (write the stages' code deps into dvc.yaml)")
    dev = p.add_subparsers(dest="dev_command", required=True)
    d = dev.add_parser(
        "deps",
        help="rewrite each stage's code-file deps in dvc.yaml from its imports; drop dvc.lock's stale entries",
    )
    d.add_argument("--check", action="store_true", help="only compare: print the differences and exit 1 if any")
    d.add_argument("--repo", default=".", help="the project folder (default: the current one)")
    d.set_defaults(fn=cmd_deps)
