"""Stage 'sc_continue' of the speech-continuation (SC) study.

One continuation system over every phonation stimulus (data/phonation/manifest.csv),
through the system runner of both studies (`voicebias.pipeline.calls.run_system`: cached,
resumable, retrying, failures recorded per item), once the manipulation check has passed, one
continuation per stimulus (`run.samples_per_item` applies to the speech-to-speech
respond stage only; the SC scoring and analysis take one continuation per item). Writes
data/continuations/<system>/ and the stage record reports/sc_continue/<system>.json
(with the planted truth of a reference continuation system).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.tasks import Task

#: the continuation task: no prompt, so it runs on every stimulus whatever its language
CONTINUE_TASK = Task("continue", "continuation", "same", {})


def _planted_truth(system: Any, sys_params: dict[str, Any]) -> dict[str, Any]:
    """A reference continuation system's planted truth, for the analysis to compare against."""
    if system.card.get("adapter") != "reference_continuation":
        return {}
    from voicebias.systems.reference_continuation import planted_truth

    return {"planted_truth": planted_truth(sys_params)}


def _excluded(path: Path | None) -> frozenset[str]:
    from voicebias.io import read_table

    if path is None or not Path(path).exists():
        return frozenset()
    return frozenset(read_table(Path(path))["stimulus_id"].astype(str))


def run_stage(
    params: dict[str, Any],
    *,
    system: str,
    manifest_path: Path,
    check_metrics: Path,
    out_dir: Path,
    stats_path: Path,
    cache_dir: Path,
    root: Path,
    excluded_path: Path | None = None,
) -> pd.DataFrame:
    """Stage 'sc_continue': continuation system `system`, built from the continuation registry,
    over the phonation stimuli (cached, resumable) less those the manipulation check excluded
    (`excluded_path`, reports/phonation/excluded_stimuli.csv: counted there, heard by no system)."""
    from voicebias.pipeline.calls import run_system
    from voicebias.systems.continuation import CONTINUATION_ADAPTERS

    tables = run_system(
        params,
        system,
        adapters=CONTINUATION_ADAPTERS,
        tasks={CONTINUE_TASK.name: CONTINUE_TASK},
        manifest_path=manifest_path,
        gate_metrics=check_metrics,
        gate="the phonation manipulation check",
        context=lambda: {
            "rate_wpm": params["sc_stimuli"]["rate_wpm"],
            "pitch_range": params["acoustics"]["pitch_range"],
            "presets": params["phonation"]["presets"],
            "parametric": params["phonation"].get("parametric"),
        },
        out_dir_for=lambda _: out_dir,
        stats_path_for=lambda _: stats_path,
        cache_dir=cache_dir,
        root=root,
        label_for=lambda _: f"sc_continue@{system}",
        annotate=_planted_truth,
        samples=1,
        exclude=_excluded(excluded_path),
    )
    return tables[CONTINUE_TASK.name]
