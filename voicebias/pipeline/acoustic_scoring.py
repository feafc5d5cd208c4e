"""Stage 'acoustic_scoring'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.scoring.acoustic import score_outputs


def run_stage(
    params: dict[str, Any],
    *,
    system: str,
    responses_root: Path,
    inputs_path: Path,
    reference_path: Path,
    out_path: Path,
    root: Path,
    cache_dir: Path,
) -> pd.DataFrame:
    """Stage 'acoustic_scoring': measure one system's outputs and write their deltas."""
    from voicebias.cards import load_card
    from voicebias.io import read_table, write_table

    parts = [read_table(Path(responses_root) / system / t / "responses.csv") for t in params["tasks"]["names"]]
    table = score_outputs(
        pd.concat(parts, ignore_index=True),
        read_table(inputs_path),
        read_table(reference_path),
        params,
        load_card(system),
        root,
        cache_dir,
    )
    write_table(out_path, table)
    return table
