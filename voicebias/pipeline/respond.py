"""Stage 'respond': one system over every task, through the runner (voicebias.systems.runner).

The failure policy: per task, failed calls out of requests above `run.max_failed_fraction`
stop the stage with one line (StageFailed) naming the system, the task, the count and the
commonest reasons, after every task has run, so that DVC does not record the stage as
done; the finished calls are in the response cache and the next run sends only the
failed ones. At or below it the failures are counted exclusions (`failed` in the stage
record, a reason per row) and the stage succeeds. Either way the calls that failed are
written to the system's ledger (voicebias.pipeline.pending_calls), so the next
`dvc repro` calls them again.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from voicebias.errors import ConfigError, NotFound, StageFailed
from voicebias.systems.base import SystemUnderTest
from voicebias.systems.runner import ResponseCache, RetryPolicy, build_asr, run_task, validate_responses
from voicebias.systems.screen import ReplyScreen
from voicebias.tasks import Task

#: reasons named in the line of a task over run.max_failed_fraction
TOP_REASONS = 3
#: the longest reason quoted in that line (characters)
REASON_CHARS = 160


def run_stage(
    params: dict[str, Any],
    system_name: str,
    task_name: str,
    manifest_path: Path,
    passages_path: Path | None,
    gate_metrics: Path,
    out_dir: Path,
    stats_path: Path,
    cache_dir: Path,
    root: Path,
    *,
    task: Task | None = None,
    gate: str = "the carrier gate",
    kind: str | None = None,
    context: dict[str, Any] | None = None,
    stage: str | None = None,
    annotate: Callable[[SystemUnderTest, dict[str, Any]], dict[str, Any]] | None = None,
    samples: int | None = None,
) -> pd.DataFrame:
    """One system x one task over all stimuli of the task's languages, `run.samples_per_item`
    answers per stimulus (docs/repeats.md).

    The keyword arguments let another stage run a system over its own stimulus table
    through the same runner (voicebias.pipeline.sc_continue does): `task`, a task that is not
    in data/tasks/prompts.yaml (task_name then only names it in errors); `gate`, what
    gate_metrics records, named in the refusal when it has not passed; `kind`, the
    kind of system the stage takes; `context`, what the system is built with besides
    the stimulus table and root (default: the passages of passages_path and
    tts.rate_wpm; passages_path may be None where context is given); `stage`, the
    name in the run log and progress line; `annotate(system, system params)`,
    tracked facts added to the stats record (a reference system's planted truth);
    `samples`, the answers per stimulus (default: params run.samples_per_item).
    """
    tables = run_tasks(
        params,
        system_name,
        [task_name],
        manifest_path,
        passages_path,
        gate_metrics,
        lambda _: out_dir,
        lambda _: stats_path,
        cache_dir,
        root,
        tasks={task_name: task} if task is not None else None,
        gate=gate,
        kind=kind,
        context=context,
        stage=(lambda _: stage) if stage else None,
        annotate=annotate,
        samples=samples,
    )
    return tables[task_name]


def run_system_stage(
    params: dict[str, Any],
    system_name: str,
    manifest_path: Path,
    passages_path: Path,
    gate_metrics: Path,
    out_dir_for: Callable[[str], Path],
    stats_path_for: Callable[[str], Path],
    cache_dir: Path,
    root: Path,
    task_names: list[str] | None = None,
    render_cache: Path | None = None,
) -> dict[str, pd.DataFrame]:
    """Stage 'respond@SYSTEM': one system over every task of `tasks.names` (or `task_names`),
    built once (a model is loaded once for all its tasks), each task's table and stats
    written to `out_dir_for(task)` and `stats_path_for(task)` (DVC clears the stage's two
    folders before it runs, so no table or record of a task no longer listed survives).
    `render_cache`: the folder of rendered utterances a system that renders its own speech
    (the reference systems) shares across tasks and systems (voicebias.tts.render_cache)."""
    names = list(task_names or params["tasks"]["names"])
    return run_tasks(
        params,
        system_name,
        names,
        manifest_path,
        passages_path,
        gate_metrics,
        out_dir_for,
        stats_path_for,
        cache_dir,
        root,
        render_cache=render_cache,
    )


def run_tasks(
    params: dict[str, Any],
    system_name: str,
    task_names: list[str],
    manifest_path: Path,
    passages_path: Path | None,
    gate_metrics: Path,
    out_dir_for: Callable[[str], Path],
    stats_path_for: Callable[[str], Path],
    cache_dir: Path,
    root: Path,
    *,
    tasks: dict[str, Task] | None = None,
    gate: str = "the carrier gate",
    kind: str | None = None,
    context: dict[str, Any] | None = None,
    stage: Callable[[str], str] | None = None,
    annotate: Callable[[SystemUnderTest, dict[str, Any]], dict[str, Any]] | None = None,
    samples: int | None = None,
    render_cache: Path | None = None,
) -> dict[str, pd.DataFrame]:
    """Build the system once and run it on each task in turn (see run_stage for the keywords;
    `tasks` maps task names to Task objects that are not in data/tasks/prompts.yaml;
    `render_cache` goes to the system's constructor where it takes one).

    The system's `check` runs once, before the first call any task sends (not at all when
    every call is cached). A task whose failed calls exceed `run.max_failed_fraction` of its
    requests raises StageFailed once every task has run and the ledger of failed calls is
    written (see the module docstring)."""
    from voicebias.io import read_json, read_table, write_json, write_table
    from voicebias.params import max_failed_fraction, samples_per_item
    from voicebias.pipeline.pending_calls import update_ledger
    from voicebias.runlog import record as record_run
    from voicebias.runlog import split_counts
    from voicebias.systems import build_system
    from voicebias.tasks import load_tasks

    samples = samples_per_item(params) if samples is None else samples
    limit = max_failed_fraction(params)
    if not read_json(gate_metrics).get("passed"):
        raise StageFailed(f"{gate} has not passed; no system may hear these stimuli")
    manifest = read_table(manifest_path)
    if context is None:
        context = {"passages": read_table(passages_path), "rate_wpm": params["tts"]["rate_wpm"]}
    if render_cache is not None:
        context = {**context, "render_cache": render_cache}
    sys_params = params["systems"].get(system_name)
    if sys_params is None:
        raise NotFound(f"params.yaml has no 'systems.{system_name}' section")
    chosen: dict[str, Task] = {}
    for name in task_names:
        if tasks is not None and tasks.get(name) is not None:
            chosen[name] = tasks[name]
            continue
        known = load_tasks()
        if name not in known:
            raise NotFound(f"unknown task '{name}'; data/tasks/prompts.yaml defines {', '.join(sorted(known))}")
        chosen[name] = known[name]
    screen = ReplyScreen.from_params(params)
    system = build_system(system_name, sys_params, stimuli=manifest, root=root, **context)
    results: dict[str, pd.DataFrame] = {}
    checked: list[bool] = []

    def check_once() -> None:  # the first task with a call to send checks; the others need not
        if not checked:
            system.check()
            checked.append(True)

    failed_keys: dict[str, list[str]] = {}
    over: list[str] = []
    try:
        if kind is not None and system.kind != kind:
            raise ConfigError(f"system '{system_name}' is a {system.kind} system; this stage needs a {kind} system")
        policy = RetryPolicy.from_params(sys_params)
        asr = build_asr(sys_params, root)
        for name, task in chosen.items():
            out_dir, stats_path = Path(out_dir_for(name)), Path(stats_path_for(name))
            label = stage(name) if stage else f"respond@{system_name}-{name}"
            if out_dir.exists():
                shutil.rmtree(out_dir)  # the task's output is rebuilt from the cache, never half-stale
            table, counts = run_task(
                system,
                task,
                manifest,
                out_dir,
                ResponseCache(cache_dir),
                int(params["base"]["seed"]),
                root,
                policy=policy,
                asr=asr,
                continuation_s=float(system.params["continuation_s"]) if system.kind == "continuation" else 0.0,
                samples=samples,
                check=check_once,
                screen=screen,
            )
            validate_responses(table, system.kind)
            write_table(out_dir / "responses.csv", table)
            if annotate is not None:
                counts.update(annotate(system, sys_params))
            tracked, run_facts = split_counts(counts)
            write_json(stats_path, tracked)
            record_run(label, {**run_facts, **system.run_facts()})
            print(
                f"{label}: {counts['requests']} requests, {counts['calls']} calls, "
                f"{counts['cache_hits']} cache hits, {counts['failed']} failed, {counts['excluded']} excluded",
                file=sys.stderr,
            )
            failed = table["status"] == "failed"
            failed_keys[name] = table.loc[failed, "cache_key"].tolist()
            if counts["requests"] and counts["failed"] > limit * counts["requests"]:
                over.append(over_limit(name, counts["failed"], counts["requests"], table.loc[failed, "error"]))
            results[name] = table
    finally:
        system.close()
    update_ledger(cache_dir, system_name, failed_keys)
    if over:
        raise StageFailed(
            f"system '{system_name}': " + "; ".join(over) + f" (more than run.max_failed_fraction "
            f"{limit:g}; the finished calls are cached and the next run sends only the failed ones)"
        )
    return results


def over_limit(task: str, failed: int, requests: int, errors: pd.Series) -> str:
    """'<task>: <failed> of <requests> calls failed: <n> x <reason>, ...', the commonest reasons first."""
    reasons = errors.fillna("no reason given").astype(str).map(lambda r: " ".join(r.split())).value_counts(sort=False)
    ranked = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    named = [f"{n} x {r if len(r) <= REASON_CHARS else r[: REASON_CHARS - 3] + '...'}" for r, n in ranked[:TOP_REASONS]]
    if len(ranked) > TOP_REASONS:
        named.append(f"{sum(n for _, n in ranked[TOP_REASONS:])} x {len(ranked) - TOP_REASONS} other reasons")
    return f"{task}: {failed} of {requests} calls failed: " + ", ".join(named)
