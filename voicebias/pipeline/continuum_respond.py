"""Stage 'continuum_respond@SYSTEM': one speech-to-speech system on the continuum's steps.

The describe and summarize tasks (`continuum.tasks`) over every step the manipulation check
passed, through the same runner, cache and failure policy as the respond stage
(voicebias.pipeline.calls). A step the check excluded is not sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

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
    cache_dir: Path,
    root: Path,
    render_cache: Path | None = None,
) -> dict[str, pd.DataFrame]:
    """System `system` on each task of `continuum.tasks` over the passed steps of `manifest_path`
    (data/continuum/manifest.csv), once the continuum's check (`gate_metrics`) has passed; each
    task's table and record go to `responses_dir_for(task)` and `report_for(task)`."""
    from voicebias.io import read_table
    from voicebias.pipeline.respond import run_s2s

    manifest = read_table(manifest_path)
    excluded = frozenset(manifest.loc[~manifest["passed"].astype(bool), "stimulus_id"].astype(str))
    return run_s2s(
        params,
        system,
        names=list(params["continuum"]["tasks"]),
        names_from="continuum.tasks",
        manifest_path=manifest_path,
        passages_path=passages_path,
        gate_metrics=gate_metrics,
        gate="the continuum's manipulation check",
        responses_dir_for=responses_dir_for,
        report_for=report_for,
        cache_dir=cache_dir,
        root=root,
        render_cache=render_cache,
        label=f"continuum_respond@{system}",
        exclude=excluded,
    )
