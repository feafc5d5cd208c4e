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
    from voicebias.errors import NotFound
    from voicebias.io import read_table
    from voicebias.params import samples_per_item
    from voicebias.pipeline.calls import run_system
    from voicebias.systems.s2s import S2S_ADAPTERS
    from voicebias.tasks import load_tasks

    known = load_tasks()
    names = list(params["continuum"]["tasks"])
    for name in names:
        if name not in known:
            raise NotFound(
                f"unknown task '{name}' in continuum.tasks; data/tasks/prompts.yaml defines {', '.join(sorted(known))}"
            )
    manifest = read_table(manifest_path)
    excluded = frozenset(manifest.loc[~manifest["passed"].astype(bool), "stimulus_id"].astype(str))

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
        gate="the continuum's manipulation check",
        context=context,
        out_dir_for=responses_dir_for,
        stats_path_for=report_for,
        cache_dir=cache_dir,
        root=root,
        label_for=lambda task: f"continuum_respond@{system}-{task}",
        samples=samples_per_item(params),
        exclude=excluded,
    )
