"""Stage 'report'."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from voicebias.report.build import build_report


def run_stage(params: dict[str, Any], analysis_dir: Path, gate_dir: Path, bank_metrics: Path, out_dir: Path,
              sc_dir: Path | None = None, phonation_dir: Path | None = None) -> dict:
    return build_report(params, analysis_dir, gate_dir, bank_metrics, out_dir, sc_dir, phonation_dir)
