"""Stage 'tracking'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voicebias.pipeline.report import determinism_records
from voicebias.report.tracking import log_pipeline_run


def run_stage(
    params: dict[str, Any],
    *,
    analysis_dir: Path,
    gate_dir: Path,
    manifest_path: Path,
    out_path: Path,
    sc_dir: Path | None = None,
    phonation_dir: Path | None = None,
    report_dir: Path | None = None,
    disaggregated: Path | None = None,
    psychometric: Path | None = None,
    usage: Path | None = None,
) -> dict:
    return log_pipeline_run(
        params,
        analysis_dir,
        gate_dir,
        manifest_path,
        out_path,
        sc_dir=sc_dir,
        phonation_dir=phonation_dir,
        report_dir=report_dir,
        disaggregated=disaggregated,
        psychometric=psychometric,
        usage=usage,
        determinism=determinism_records(params),
    )
