"""Stage 'sc_analysis'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.analysis.sc import analyse


def run_stage(
    params: dict[str, Any],
    *,
    scored_paths: list[Path],
    prompt_measures_path: Path,
    out_dir: Path,
    metrics_path: Path,
    continue_stats: list[Path] | None = None,
) -> dict:
    """Stage 'sc_analysis': write every SC table under out_dir and the stage metrics.
    Planted truths come from the continue stages' records (`continue_stats`)."""
    from voicebias.io import read_json, read_table, write_json, write_table

    scored = pd.concat([read_table(p) for p in scored_paths], ignore_index=True)
    truths = {}
    for p in continue_stats or []:
        rec = read_json(p)
        if rec.get("planted_truth"):
            truths[Path(p).stem] = rec["planted_truth"]
    tables = analyse(scored, read_table(prompt_measures_path), truths, seed=int(params["base"]["seed"]))
    out_dir = Path(out_dir)
    for name, t in tables.items():
        write_table(out_dir / f"{name}.csv", t)
    metrics: dict[str, Any] = {}
    for r in tables["success"].itertuples(index=False):
        metrics.setdefault(r.system, {})["success_rate"] = round(float(r.success_rate), 4)
    for r in tables["retention"].itertuples(index=False):
        metrics.setdefault(r.system, {})[f"retention_{r.measure}_{r.voice_gender}"] = round(float(r.retention), 4)
    for r in tables["speaker_similarity"].itertuples(index=False):
        metrics.setdefault(r.system, {})[f"similarity_{r.phonation}_{r.voice_gender}"] = round(float(r.mean), 4)
    pvr = tables.get("planted_vs_recovered")
    if pvr is not None and len(pvr):
        metrics["planted_recovered"] = bool(pvr["recovered_ok"].all())
    write_json(metrics_path, metrics)
    return metrics
