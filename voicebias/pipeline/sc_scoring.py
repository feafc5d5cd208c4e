"""Stage 'sc_scoring'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.scoring.continuation import score_continuations


def run_stage(
    params: dict[str, Any],
    *,
    system: str,
    responses_path: Path,
    manifest_path: Path,
    out_path: Path,
    root: Path,
    cache_dir: Path | None = None,
    measure_cache: Path | None = None,
    embedding_cache: Path | None = None,
) -> pd.DataFrame:
    """Stage 'sc_scoring': score one continuation system's outputs (no system is called)."""
    from voicebias.io import read_table, write_table

    table = score_continuations(
        read_table(responses_path),
        read_table(manifest_path),
        params,
        root,
        cache_dir=cache_dir,
        measure_cache=measure_cache,
        embedding_cache=embedding_cache,
    )
    write_table(out_path, table)
    return table
