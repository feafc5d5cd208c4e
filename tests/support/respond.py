"""Run one system on one task the way the respond stage does, and read back every byte it wrote:
for the tests that compare a stage's outputs across ways of serving a system."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from voicebias.io import write_table
from voicebias.systems.runner import ResponseCache, run_task
from voicebias.tasks import load_tasks

OUT = Path("data") / "responses" / "served" / "describe"


def run(system, stim, root, cache_dir, policy=None, task: str = "describe", check=None):
    """(table, counts, wall s, {path: bytes} of every file under the output folder, responses.csv included).

    Stimulus paths are read from `root`, outputs go to `root`/data/responses/served/describe; `check`
    replaces the system's pre-run check (the runner's `check`)."""
    out = Path(root) / OUT
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    table, counts = run_task(
        system,
        load_tasks()[task],
        stim,
        out,
        ResponseCache(cache_dir),
        1,
        root,
        policy=policy,
        progress=False,
        check=check,
    )
    wall = time.perf_counter() - t0
    write_table(out / "responses.csv", table)
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    return table, counts, wall, files
