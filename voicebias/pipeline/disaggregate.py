"""Stage 'disaggregate'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.blas import single_blas_thread


@single_blas_thread
def run_stage(
    params: dict[str, Any], *, scored_paths: list[Path], acoustic_paths: list[Path], sc_paths: list[Path], out_dir: Path
) -> dict[str, Any]:
    """Stage 'disaggregate': every rate and mean by group with bootstrap intervals
    (voicebias.analysis.disaggregated) in out_dir/disaggregated.csv, its row counts per system in metrics.json."""
    from voicebias.analysis.disaggregated import disaggregate, s2s_items, sc_items
    from voicebias.io import read_table, write_json, write_table

    scored = pd.concat([read_table(Path(p)) for p in scored_paths], ignore_index=True)
    acoustic = [read_table(Path(p)) for p in acoustic_paths if Path(p).exists()]
    parts = [s2s_items(scored, pd.concat(acoustic, ignore_index=True) if acoustic else None)]
    if sc_paths:
        parts.append(sc_items(pd.concat([read_table(Path(p)) for p in sc_paths], ignore_index=True)))
    items = pd.concat(parts, ignore_index=True)
    table = disaggregate(
        items,
        resamples=int(params["disaggregate"]["resamples"]),
        confidence=float(params["analyze"]["confidence"]),
        seed=int(params["base"]["seed"]),
    )
    out_dir = Path(out_dir)
    write_table(out_dir / "disaggregated.csv", table)
    # per system, so a change to one system changes only that system's metrics
    metrics = {
        system: {
            "rows": int(len(g)),
            "no_spread_rows": int((g["ci_method"] == "no spread").sum()),
            "no_interval_rows": int((g["ci_method"] == "n<2").sum()),
        }
        for system, g in table.groupby("system", sort=True)
    }
    write_json(out_dir / "metrics.json", metrics)
    return metrics
