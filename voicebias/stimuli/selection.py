"""Which speech-continuation prompts a study uses: `phonation.prompts_per_category` and
`phonation.max_prompts` (docs/phonation.md). The sc_stimuli stage voices only these prompts and
the phonation stage converts them."""

from __future__ import annotations

import pandas as pd


def selected_prompt_ids(table: pd.DataFrame, per_category: int | None, max_prompts: int | None) -> list[str]:
    """The ids of the first `per_category` prompts of each category (by prompt id), then of the
    first `max_prompts` prompts overall (None keeps all), among the prompts of `table` (a prompt
    table or a stimulus manifest: columns prompt_id and category)."""
    prompts = table[["prompt_id", "category"]].drop_duplicates().sort_values("prompt_id")
    if per_category is not None:
        prompts = prompts.groupby("category", sort=False).head(int(per_category))
    if max_prompts is not None:
        prompts = prompts.head(int(max_prompts))
    return list(prompts["prompt_id"])
