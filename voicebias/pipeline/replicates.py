"""Stage 'replicates@SYSTEM': whole-run replicates of the chosen tasks, and how much each result moves.

With `run.replicates` N > 1, the system answers the tasks of `run.replicate_tasks` N - 1 more times,
each time under a new base seed (voicebias.systems.base.replicate_seed): the same stimuli, prompts
and `run.samples_per_item`, through the respond stage's runner (cached, retried, the failure policy;
no determinism probe), the system built once for all runs. Each replicate's replies are scored as
the scoring and acoustic_scoring stages score the run's, and every cell of the disaggregated table
gets one estimate per run (run 0 is the run itself, read from data/scored). Writes:

- `data/replicates/<system>/r<r>/<task>/`: each replicate's replies and responses.csv, and
  `data/replicates/<system>/r<r>/scored.csv` (and `acoustics.csv` for acoustic tasks): its scores;
- `reports/replicates/<system>/cells.csv`: one row per run x cell
  (voicebias.analysis.replicates.CELL_COLUMNS);
- `reports/replicates/<system>/spread.csv`: one row per cell, its min, median, max, mean, SD and CV
  over the runs beside run 0's estimate (voicebias.analysis.replicates.SPREAD_COLUMNS; the report
  adds run 0's item interval from the disaggregated table);
- `reports/replicates/<system>/metrics.json`: {system: the runs, the tasks, requests and failed
  calls per replicate and task, and per task x metric the largest SD and CV over its cells}.

One stage per system, as respond, so a change to one system's settings re-runs its replicates
alone. With N = 1 nothing is sent and the tables have their columns and no rows.
docs/repeats.md, "Whole-run replicates".
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pandas as pd


def replicate_params(params: dict[str, Any]) -> dict[str, Any]:
    """params for the replicates: no determinism probe (the replicates are themselves the repeat)."""
    out = copy.deepcopy(params)
    out["run"]["determinism_probe"] = 0
    return out


def run_stage(
    params: dict[str, Any],
    *,
    system: str,
    manifest_path: Path,
    passages_path: Path,
    gate_metrics: Path,
    scored_path: Path,
    acoustic_path: Path,
    inputs_path: Path,
    reference_path: Path,
    data_dir: Path,
    cache_dir: Path,
    measure_cache: Path,
    root: Path,
    out_dir: Path,
    render_cache: Path | None = None,
) -> pd.DataFrame:
    """Stage 'replicates@SYSTEM' (see the module docstring): `scored_path` and `acoustic_path` are run 0's
    scored tables of `system`; replicate r's replies to a task go to `data_dir`/r<r>/<task> (`data_dir`
    is made even when nothing is replicated, as DVC tracks it); returns the spread table."""
    from voicebias.analysis.disaggregated import s2s_items
    from voicebias.analysis.replicates import CELL_COLUMNS, cell_estimates, spread
    from voicebias.analysis.rq1 import ACOUSTIC_TASKS
    from voicebias.cards import load_card
    from voicebias.io import read_table, write_json, write_table
    from voicebias.params import replicate_tasks
    from voicebias.pipeline.respond import run_s2s
    from voicebias.scoring.acoustic import score_outputs
    from voicebias.scoring.text import score_responses

    n_runs = int(params["run"].get("replicates", 1))
    tasks = replicate_tasks(params)
    acoustic_tasks = [t for t in tasks if t in ACOUSTIC_TASKS]
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    cells: list[pd.DataFrame] = []
    calls: dict[str, dict[str, dict[str, int]]] = {}

    def estimates(scored: pd.DataFrame, acoustic: pd.DataFrame | None, replicate: int) -> None:
        scored = scored[scored["task"].isin(tasks)]
        if acoustic is not None:
            acoustic = acoustic[acoustic["task"].isin(acoustic_tasks)]
        cells.append(cell_estimates(s2s_items(scored, acoustic)).assign(replicate=replicate))

    if tasks:
        acoustic0 = read_table(acoustic_path) if acoustic_tasks and Path(acoustic_path).exists() else None
        estimates(read_table(scored_path), acoustic0, 0)
        tables = run_s2s(
            replicate_params(params),
            system,
            names=tasks,
            names_from="run.replicate_tasks",
            manifest_path=manifest_path,
            passages_path=passages_path,
            gate_metrics=gate_metrics,
            gate="the carrier gate",
            responses_dir_for=lambda task, r: data_dir / f"r{r}" / task,
            report_for=lambda task, r: data_dir / f"r{r}" / f"{task}.json",
            cache_dir=cache_dir,
            root=root,
            render_cache=render_cache,
            label=f"replicates@{system}",
            ledger=False,
            replicates=list(range(1, n_runs)),
        )
        # read once for every replicate: the inputs' measures and the composite's reference
        measured = (read_table(inputs_path), read_table(reference_path)) if acoustic_tasks else ()
        card = load_card(system)
        for r in range(1, n_runs):
            mine = {task: tables[(task, r)] for task in tasks}
            responses = pd.concat(list(mine.values()), ignore_index=True)
            calls[f"r{r}"] = {
                task: {"requests": int(len(t)), "failed": int((t["status"] == "failed").sum())}
                for task, t in mine.items()
            }
            # written as the scoring stages write theirs and read back, so that each run's cells come from
            # tables of one precision (run 0's are read from data/scored)
            write_table(data_dir / f"r{r}" / "scored.csv", score_responses(responses))
            acoustic = None
            if acoustic_tasks:
                scored_audio = score_outputs(
                    responses[responses["task"].isin(acoustic_tasks)].reset_index(drop=True),
                    *measured,
                    params,
                    card,
                    root,
                    measure_cache,
                )
                write_table(data_dir / f"r{r}" / "acoustics.csv", scored_audio)
                acoustic = read_table(data_dir / f"r{r}" / "acoustics.csv")
            estimates(read_table(data_dir / f"r{r}" / "scored.csv"), acoustic, r)

    table = (
        pd.concat(cells, ignore_index=True)[CELL_COLUMNS]
        .sort_values(["task", "metric", "replicate"], kind="stable")
        .reset_index(drop=True)
        if cells
        else pd.DataFrame(columns=CELL_COLUMNS)
    )
    out = spread(table)
    out_dir = Path(out_dir)
    write_table(out_dir / "cells.csv", table)
    write_table(out_dir / "spread.csv", out)
    write_json(out_dir / "metrics.json", {system: replicate_metrics(n_runs, tasks, calls, out)})
    return out


def replicate_metrics(
    n_runs: int, tasks: list[str], calls: dict[str, Any], spread_table: pd.DataFrame
) -> dict[str, Any]:
    """One system's replicates record: runs, tasks, requests and failed calls per replicate x task, and
    per task x metric the number of cells and their largest SD and CV (cells pooled over languages)."""
    import numpy as np

    worst: dict[str, dict[str, Any]] = {}
    pooled = spread_table[spread_table["lang"] == "ALL"] if len(spread_table) else spread_table
    for (task, metric), g in pooled.groupby(["task", "metric"], sort=True):
        sd = g["sd"].to_numpy(float)
        cv = g["cv"].to_numpy(float)
        worst.setdefault(task, {})[metric] = {
            "cells": int(len(g)),
            "max_sd": float(np.nanmax(sd)) if np.isfinite(sd).any() else None,
            "max_cv": float(np.nanmax(cv)) if np.isfinite(cv).any() else None,
        }
    return {"runs": n_runs, "tasks": tasks, "calls": calls, "spread": worst}


__all__ = ["replicate_metrics", "replicate_params", "run_stage"]
