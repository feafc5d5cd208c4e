"""A system over a stimulus table, task by task, through the runner: the body of the respond and
sc_continue stages (each builds its systems from its own kind's registry).

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
from typing import Any, Callable, Sequence

import pandas as pd

from voicebias.errors import NotFound, StageFailed
from voicebias.registry import Registry
from voicebias.systems.base import SystemUnderTest, replicate_seed
from voicebias.systems.runner import ResponseCache, RetryPolicy, build_asr, run_task, validate_responses
from voicebias.systems.screen import ReplyScreen
from voicebias.tasks import Task

#: reasons named in the line of a task over run.max_failed_fraction
TOP_REASONS = 3
#: the longest reason quoted in that line (characters)
REASON_CHARS = 160


def run_system(
    params: dict[str, Any],
    system_name: str,
    *,
    adapters: Registry,
    tasks: dict[str, Task],
    manifest_path: Path,
    gate_metrics: Path,
    gate: str,
    context: Callable[[], dict[str, Any]],
    out_dir_for: Callable[[str], Path],
    stats_path_for: Callable[[str], Path],
    cache_dir: Path,
    root: Path,
    label_for: Callable[[str], str],
    samples: int,
    annotate: Callable[[SystemUnderTest, dict[str, Any]], dict[str, Any]] | None = None,
    exclude: frozenset[str] = frozenset(),
    ledger: bool = True,
    replicates: Sequence[int] | None = None,
) -> dict[Any, pd.DataFrame]:
    """Build system `system_name` from `adapters` once and run it on each of `tasks` in turn over the
    stimuli of `manifest_path`, `samples` answers per stimulus, once `gate_metrics` records that
    `gate` passed.

    Each task's table goes to `out_dir_for(task)`/responses.csv and its record to
    `stats_path_for(task)`; `label_for(task)` names it in the run log and the progress line;
    `context()` returns what the system is built with besides the stimulus table and root (read
    once the gate has passed);
    `annotate(system, system params)` returns tracked facts added to each record; stimuli whose
    stimulus_id is in `exclude` (a gate's counted exclusions) are not sent. The
    system's `check` runs once, before the first call any task sends (not at all when every
    call is cached). A task whose failed calls exceed `run.max_failed_fraction` of its
    requests raises StageFailed once every task has run and the ledger of failed calls is
    written (see the module docstring). `ledger` False: the run's failed calls are not written to the
    system's ledger (the whole-run replicates, whose failures their own table counts).

    `replicates` (whole-run replicates, run.replicates): the system, built once, answers every task
    once per replicate r under the base seed replicate_seed(base.seed, r); `out_dir_for`,
    `stats_path_for` and `label_for` then take (task, r), the failure policy holds per task x
    replicate, and the tables are keyed (task, r)."""
    from voicebias.io import read_json, read_table, write_json, write_table
    from voicebias.params import max_failed_fraction
    from voicebias.pipeline.pending_calls import update_ledger
    from voicebias.runlog import record as record_run
    from voicebias.runlog import split_counts
    from voicebias.systems.build import build_from

    limit = max_failed_fraction(params)
    if not read_json(gate_metrics).get("passed"):
        raise StageFailed(f"{gate} has not passed; no system may hear these stimuli")
    manifest = read_table(manifest_path)
    if exclude:
        manifest = manifest[~manifest["stimulus_id"].astype(str).isin(exclude)].reset_index(drop=True)
    sys_params = params["systems"].get(system_name)
    if sys_params is None:
        raise NotFound(f"params.yaml has no 'systems.{system_name}' section")
    screen = ReplyScreen.from_params(params)
    system = build_from(adapters, system_name, sys_params, stimuli=manifest, root=root, **context())
    results: dict[str, pd.DataFrame] = {}
    checked: list[bool] = []

    def check_once() -> None:  # the first task with a call to send checks; the others need not
        if not checked:
            system.check()
            checked.append(True)

    failed_keys: dict[str, list[str]] = {}
    over: list[str] = []
    try:
        policy = RetryPolicy.from_params(sys_params)
        asr = build_asr(sys_params, root)
        base_seed = int(params["base"]["seed"])
        built: list[tuple[int | None, Path, pd.DataFrame]] = []  # (replicate, folder, table) per run
        runs: list[tuple[str, Task, int | None]] = [(name, task, None) for name, task in tasks.items()]
        if replicates is not None:
            runs = [(name, task, r) for r in replicates for name, task in tasks.items()]
        for name, task, r in runs:
            at = (name,) if r is None else (name, r)
            out_dir, stats_path = Path(out_dir_for(*at)), Path(stats_path_for(*at))
            label = label_for(*at)
            key = name if r is None else at
            where = name if r is None else f"{name} (replicate {r})"
            if out_dir.exists():
                shutil.rmtree(out_dir)  # the task's output is rebuilt from the cache, never half-stale
            table, counts = run_task(
                system,
                task,
                manifest,
                out_dir,
                ResponseCache(cache_dir),
                base_seed if r is None else replicate_seed(base_seed, r),
                root,
                policy=policy,
                asr=asr,
                continuation_s=float(system.params["continuation_s"]) if system.kind == "continuation" else 0.0,
                samples=samples,
                check=check_once,
                screen=screen,
                probe=int(params["run"].get("determinism_probe", 0)) if system.probed else 0,
            )
            # every table is checked once all are built, in one gate per stage (below): the
            # tasks' tables stacked, each stimulus unique within its task (and replicate)
            built.append((r, out_dir, table))
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
            failed_keys.setdefault(name, []).extend(table.loc[failed, "cache_key"].tolist())
            if counts["requests"] and counts["failed"] > limit * counts["requests"]:
                over.append(over_limit(where, counts["failed"], counts["requests"], table.loc[failed, "error"]))
            results[key] = table
        if built:
            if replicates is None:
                validate_responses(pd.concat([t for _, _, t in built], ignore_index=True), system.kind, ("task",))
            else:
                validate_responses(
                    pd.concat([t.assign(replicate=r) for r, _, t in built], ignore_index=True),
                    system.kind,
                    ("task", "replicate"),
                )
            for _, out_dir, t in built:
                write_table(out_dir / "responses.csv", t)
    finally:
        system.close()
    if ledger:
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
