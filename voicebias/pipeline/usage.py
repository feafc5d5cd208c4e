"""Stage 'usage': what every system's calls used and cost (voicebias.cost), per call and in totals.

Reads the response tables of the run (the S2S tasks, the continuum tasks and the continuations),
the stimulus manifests (input durations) and the system cards (price tables), and writes
`reports/usage/`: `calls.csv` (one row per call, voicebias.cost.USAGE_COLUMNS), `usage.csv`
(totals per system x part x task, and per system over all its calls, task "ALL") and
`metrics.json` (the per-system totals). Every number is read from tracked tables, so the files are
a function of the run's replies (no wall-clock fact enters them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pandas as pd

#: the per-system x part x task totals' leading columns
TOTAL_KEYS = ["system", "part", "task"]


def run_stage(
    params: dict[str, Any],
    *,
    responses_dir_for: Callable[[str, str], Path],
    continuum_responses_dir_for: Callable[[str, str], Path],
    continuations_for: Callable[[str], Path],
    manifests: list[Path],
    cards_dir: Path,
    out_dir: Path,
) -> pd.DataFrame:
    """Stage 'usage': the responses tables (responses.csv) in `responses_dir_for(system, task)` and
    `continuum_responses_dir_for(system, task)`, and `continuations_for(system)`, the continuation
    table (absent ones are skipped: a part that did not run); `manifests` give each stimulus'
    duration."""
    from voicebias.cards import load_card
    from voicebias.cost import USAGE_COLUMNS, read_durations, usage_table, usage_totals
    from voicebias.io import read_table, write_json, write_table

    durations = read_durations(manifests)
    tasks = list(params["tasks"]["names"])
    cont = params.get("continuum") or {}
    cont_tasks = list(cont.get("tasks") or []) if cont.get("enabled", True) else []
    parts: list[tuple[str, str, list[tuple[str, Path]]]] = []
    for system in params["run"]["systems"]:
        tables = [("s2s", responses_dir_for(system, t) / "responses.csv") for t in tasks]
        tables += [("continuum", continuum_responses_dir_for(system, t) / "responses.csv") for t in cont_tasks]
        parts.append((system, "s2s", tables))
    for system in params["run"].get("sc_systems") or []:
        parts.append((system, "sc", [("sc", continuations_for(system))]))

    calls, totals, metrics = [], [], {}
    for system, _, tables in parts:
        pricing = load_card(system, cards_dir).get("pricing")
        mine = []
        for part, path in tables:
            if not Path(path).exists():
                continue
            t = usage_table(read_table(path), durations, pricing, part)
            mine.append(t)
        if not mine:
            continue
        allc = pd.concat(mine, ignore_index=True)
        calls.append(allc)
        for (part, task), g in allc.groupby(["part", "task"], sort=True):
            totals.append({"system": system, "part": part, "task": task, **usage_totals(g, pricing)})
        overall = usage_totals(allc, pricing)
        totals.append({"system": system, "part": "ALL", "task": "ALL", **overall})
        metrics[system] = overall
    table = pd.concat(calls, ignore_index=True) if calls else pd.DataFrame(columns=USAGE_COLUMNS)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_table(out_dir / "calls.csv", table)
    summary = pd.DataFrame(totals)
    write_table(out_dir / "usage.csv", summary)
    write_json(out_dir / "metrics.json", metrics)
    return summary
