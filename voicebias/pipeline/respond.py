"""Stage 'respond@SYSTEM': one speech-to-speech system over every task (voicebias.pipeline.calls
runs it: cached, resumable, retrying, the failure policy), built from the speech-to-speech
registry once for all tasks. A reference system's planted truth is recorded beside its answers
(reports/respond/<system>/planted_truth.json), where the analysis reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pandas as pd


def run_stage(
    params: dict,
    *,
    system: str,
    manifest_path: Path,
    passages_path: Path,
    gate_metrics: Path,
    responses_dir_for: Callable[[str], Path],
    report_for: Callable[[str], Path],
    planted_truth_path: Path,
    cache_dir: Path,
    root: Path,
    render_cache: Path | None = None,
    task_names: list[str] | None = None,
) -> dict[str, pd.DataFrame]:
    """Stage 'respond@SYSTEM': system `system` over every task of `tasks.names` (or `task_names`),
    `run.samples_per_item` answers per stimulus (docs/repeats.md), each task's table and record
    written to `responses_dir_for(task)` and `report_for(task)` (DVC clears the stage's two
    folders before it runs, so no table or record of a task no longer listed survives).
    `render_cache`: the folder of rendered utterances a system that renders its own speech
    (the reference systems) shares across tasks and systems (voicebias.tts.render_cache)."""
    from voicebias.io import read_table, write_json

    tables = run_s2s(
        params,
        system,
        names=list(task_names or params["tasks"]["names"]),
        names_from="tasks.names",
        manifest_path=manifest_path,
        passages_path=passages_path,
        gate_metrics=gate_metrics,
        gate="the carrier gate",
        responses_dir_for=responses_dir_for,
        report_for=report_for,
        cache_dir=cache_dir,
        root=root,
        render_cache=render_cache,
        label=f"respond@{system}",
    )
    truth = planted_truth(system, params["systems"][system], read_table(manifest_path))
    if truth is not None:
        write_json(planted_truth_path, truth)
    return tables


def run_s2s(
    params: dict,
    system: str,
    *,
    names: list[str],
    names_from: str,
    manifest_path: Path,
    passages_path: Path,
    gate_metrics: Path,
    gate: str,
    responses_dir_for: Callable[[str], Path],
    report_for: Callable[[str], Path],
    cache_dir: Path,
    root: Path,
    render_cache: Path | None,
    label: str,
    exclude: frozenset[str] = frozenset(),
    ledger: bool = True,
    replicates: list[int] | None = None,
) -> dict[Any, pd.DataFrame]:
    """Speech-to-speech system `system`, built once from the registry, on tasks `names` (checked
    against data/tasks/prompts.yaml; `names_from` says where they were set) over the stimuli of
    `manifest_path` but `exclude`, once `gate_metrics` records that `gate` passed: the body of the
    respond and continuum_respond stages, and of the whole-run replicates, which pass `replicates`
    and `ledger` False (voicebias.pipeline.calls.run_system: the callbacks then take (task, r) and
    the tables are keyed (task, r))."""
    from voicebias.errors import NotFound
    from voicebias.io import read_table
    from voicebias.params import samples_per_item
    from voicebias.pipeline.calls import run_system
    from voicebias.systems.s2s import S2S_ADAPTERS
    from voicebias.tasks import load_tasks

    known = load_tasks()
    for name in names:
        if name not in known:
            raise NotFound(
                f"unknown task '{name}' in {names_from}; data/tasks/prompts.yaml defines {', '.join(sorted(known))}"
            )

    def context() -> dict:
        extra = {} if render_cache is None else {"render_cache": render_cache}
        return {"passages": read_table(passages_path), "rate_wpm": params["tts"]["rate_wpm"], **extra}

    return run_system(
        params,
        system,
        adapters=S2S_ADAPTERS,
        tasks={n: known[n] for n in names},
        manifest_path=manifest_path,
        gate_metrics=gate_metrics,
        gate=gate,
        context=context,
        out_dir_for=responses_dir_for,
        stats_path_for=report_for,
        cache_dir=cache_dir,
        root=root,
        label_for=lambda task, *r: f"{label}-{task}" + "".join(f"-r{x}" for x in r),
        samples=samples_per_item(params),
        exclude=exclude,
        ledger=ledger,
        replicates=replicates,
    )


def planted_truth(system: str, sys_params: dict, stimuli: pd.DataFrame | None = None) -> dict | None:
    """A reference system's planted truth in the analysis' units (None for a system under audit);
    `stimuli`, the stimulus manifest, weights it by the design (voicebias.systems.reference.planted_truth)."""
    from voicebias.cards import load_card

    if load_card(system)["adapter"] != "reference":
        return None
    from voicebias.systems.reference import planted_truth as reference_truth

    return reference_truth(sys_params, stimuli)
