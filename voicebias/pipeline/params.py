"""Stage 'params'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voicebias.params import load_params


def run_stage(*, params_path: Path, out_path: Path) -> dict[str, Any]:
    """Stage 'params': validate the parameter file; write a record that changes only with the schema's verdict.

    Every other stage depends on its output, so DVC runs this first and a bad key stops
    `dvc repro` before any stage does work. The record holds no parameter values, so a
    valid change leaves it byte-identical and re-runs only the stages that read the change.
    """
    from voicebias.io import write_json

    params = load_params(params_path)
    record = {"valid": True, "sections": sorted(params)}
    write_json(Path(out_path), record)
    return record
