"""Stage 'scoring'."""

from __future__ import annotations

import pandas as pd

from voicebias.scoring.text import score_responses


def run_stage(*, system: str, tasks: list[str], responses_root, out_path) -> pd.DataFrame:
    """Stage 'scoring': score every task's transcripts of one system into one table."""
    from pathlib import Path

    from voicebias.io import read_table, write_table

    parts = []
    for task in tasks:
        path = Path(responses_root) / system / task / "responses.csv"
        parts.append(read_table(path))
    scored = score_responses(pd.concat(parts, ignore_index=True))
    write_table(Path(out_path), scored)
    return scored
