"""Stage 'sc_continue' of the speech-continuation (SC) study.

One continuation system over every phonation stimulus (data/phonation/manifest.csv),
through the cached, resumable runner (voicebias.respond), once the manipulation
check has passed. Writes data/continuations/<system>/ and the stage record
reports/sc_continue/<system>.json (with the planted truth of a reference system).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pandas as pd


def continue_stage(params: dict[str, Any], system_name: str, manifest_path: Path, check_metrics: Path, out_dir: Path,
                   stats_path: Path, cache_dir: Path, root: Path) -> pd.DataFrame:
    """Stage 'continue': one continuation system over the phonation stimuli (cached, resumable)."""
    import shutil

    from voicebias.io import read_json, read_table, write_json, write_table
    from voicebias.respond import ResponseCache, RetryPolicy, build_asr, run_task, validate_responses
    from voicebias.runlog import record as record_run
    from voicebias.runlog import split_counts
    from voicebias.systems import build_system
    from voicebias.tasks import Task

    if not read_json(check_metrics).get("passed"):
        raise RuntimeError("the phonation manipulation check has not passed; no system may hear these stimuli")
    manifest = read_table(manifest_path)
    sys_params = params["systems"].get(system_name)
    if sys_params is None:
        raise KeyError(f"params.yaml has no 'systems.{system_name}' section")
    system = build_system(system_name, sys_params, stimuli=manifest, root=root,
                          rate_wpm=params["sc_stimuli"]["rate_wpm"],
                          pitch_range=params["acoustics"]["pitch_range"], presets=params["phonation"]["presets"],
                          parametric=params["phonation"].get("parametric"))
    if system.kind != "continuation":
        raise ValueError(f"system '{system_name}' is a {system.kind} system; the SC study needs a continuation system")
    task = Task("continue", "continuation", "same", {lang: "" for lang in sorted(manifest["lang"].unique())})
    try:
        if out_dir.exists():
            shutil.rmtree(out_dir)
        table, counts = run_task(system, task, manifest, out_dir, ResponseCache(cache_dir), int(params["base"]["seed"]),
                                 root, policy=RetryPolicy.from_params(sys_params), asr=build_asr(sys_params, root),
                                 continuation_s=float(system.params["continuation_s"]))
    finally:
        system.close()
    validate_responses(table, "continuation")
    write_table(out_dir / "responses.csv", table)
    if system.card.get("adapter") == "reference_continuation":
        from voicebias.systems.reference_continuation import planted_truth

        counts["planted_truth"] = planted_truth(sys_params)
    tracked, run_facts = split_counts(counts)
    write_json(stats_path, tracked)
    record_run(f"sc_continue@{system_name}", run_facts)
    print(f"continue {system_name}: {counts['requests']} requests, {counts['calls']} calls, "
          f"{counts['cache_hits']} cache hits, {counts['failed']} failed", file=sys.stderr)
    return table
