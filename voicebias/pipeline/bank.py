"""Stage 'bank'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.stimuli.bank import load_bank, render_markdown, validate_passages


def run_stage(params: dict[str, Any], *, bank_dir: Path, out_table: Path, metrics_path: Path) -> pd.DataFrame:
    """Stage 'bank': read, lint and validate the bank; write the passage table, its
    metrics and a plain-text review copy (bank.md beside the metrics)."""
    from voicebias.io import write_json, write_table
    from voicebias.stimuli.lint import rule_columns

    languages = params["base"]["languages"]
    df = load_bank(bank_dir, languages)
    report = validate_passages(df, params["bank"]["length_window"], languages)
    write_table(out_table, df)
    counts = df.groupby(["lang", "pole"]).size()
    write_json(
        metrics_path,
        {
            "passages": int(len(df)),
            "per_cell": {f"{lang}_{p}": int(n) for (lang, p), n in counts.items()},
            "expectations_passed": report.n_expectations,
            "lint_rules_checked": len(rule_columns(languages)),
            "review_status": {
                str(k): int(v) for k, v in df["review_status"].fillna("none").value_counts().sort_index().items()
            },
        },
    )
    review = Path(metrics_path).parent / "bank.md"
    review.write_text(render_markdown(df, params["bank"]["length_window"]), encoding="utf-8")
    return df
