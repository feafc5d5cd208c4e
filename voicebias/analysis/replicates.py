"""Whole-run replicates: how much each cell of the disaggregated table moves from one run to the next.

`run.replicates` N makes the calls of the replicated tasks N times in all (run 0 is the run itself,
run r >= 1 the same requests under another base seed, voicebias.systems.base.replicate_seed). Each
run's long item table (voicebias.analysis.disaggregated.s2s_items) gives every cell (system x task x
language x voice gender x condition x metric, also pooled over languages and, for describe, by cell
type) its estimate, the mean of its item values, as the disaggregated table computes it
(`cell_estimates`). `spread` then gives each cell's min, median, max, mean, SD and CV over the runs,
beside run 0's estimate, and the audit card adds run 0's item interval from the disaggregated table
(voicebias.report.card.with_item_intervals): the item interval says how far another set of items could move the
estimate, the spread how far another run of the same items does. docs/repeats.md, "Whole-run
replicates".
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from voicebias.analysis.disaggregated import KEYS, _pooled, item_values
from voicebias.analysis.repeats import has_repeats
from voicebias.analysis.status import NOT_ESTIMABLE, OK

#: one row per replicate x cell
CELL_COLUMNS = ["replicate", *KEYS, "n", "estimate"]
#: one row per cell: the spread over the runs beside run 0's item interval
SPREAD_COLUMNS = [
    *KEYS,
    "replicates",
    "n",
    "estimate",
    "min",
    "median",
    "max",
    "mean",
    "sd",
    "cv",
    "status",
    "reason",
]


def cell_estimates(items: pd.DataFrame) -> pd.DataFrame:
    """Each cell's item count and estimate (the mean of its item values; with repeats, of each item's
    mean over its samples) of one run's long item table: the `n` and `estimate` the disaggregated
    table gives the same items.

    >>> items = pd.DataFrame({"study": "s2s", "system": "a", "task": "describe", "lang": "en",
    ...     "voice_gender": "male", "condition_factor": "content_pole", "metric": "misgender_rate",
    ...     "condition": "neutral", "stimulus_id": list("abcd"), "value": [0.0, 1, 1, 0]})
    >>> t = cell_estimates(items)
    >>> print(t[t["lang"] == "en"][["condition", "n", "estimate"]].to_string(index=False))
    condition  n  estimate
      neutral  4       0.5
    """
    cols = [c for c in CELL_COLUMNS if c != "replicate"]
    if not len(items):
        return pd.DataFrame(columns=cols)
    if has_repeats(items):
        items = item_values(items)
    pooled = _pooled(items)
    out = pooled.groupby(KEYS, sort=True, dropna=False)["value"].agg(n="size", estimate="mean").reset_index()
    return out[cols]


def spread(cells: pd.DataFrame) -> pd.DataFrame:
    """One row per cell of `cells` (CELL_COLUMNS, one row per replicate x cell): the number of runs
    that estimated it, and the min, median, max, mean, SD (n - 1) and CV (SD / |mean|) of its
    estimates over them; `n` and `estimate` are run 0's (voicebias.report.card.with_item_intervals
    adds its interval).

    A cell that fewer than two runs estimated has no SD (status not_estimable, reason
    'estimated in fewer than 2 runs'); a cell whose mean is 0 has an SD but no CV.

    >>> cells = pd.DataFrame({"replicate": [0, 1, 2], "study": "s2s", "system": "a", "task": "describe",
    ...     "lang": "ALL", "voice_gender": "male", "condition_factor": "content_pole", "condition": "neutral",
    ...     "metric": "misgender_rate", "n": 10, "estimate": [0.2, 0.3, 0.4]})
    >>> s = spread(cells)
    >>> print(s[["replicates", "min", "median", "max", "sd", "cv"]].round(3).to_string(index=False))
     replicates  min  median  max  sd  cv
              3  0.2     0.3  0.4 0.1 0.333
    """
    if not len(cells):
        return pd.DataFrame(columns=SPREAD_COLUMNS)
    rows = []
    for key, g in cells.groupby(KEYS, sort=True, dropna=False):
        values = g["estimate"].to_numpy(float)
        values = values[np.isfinite(values)]
        k = len(values)
        mean = float(values.mean()) if k else np.nan
        sd = float(values.std(ddof=1)) if k >= 2 else np.nan
        run0 = g[g["replicate"] == 0]
        rows.append(
            {
                **dict(zip(KEYS, key)),
                "replicates": k,
                "n": int(run0["n"].iloc[0]) if len(run0) else np.nan,
                "estimate": float(run0["estimate"].iloc[0]) if len(run0) else np.nan,
                "min": float(values.min()) if k else np.nan,
                "median": float(np.median(values)) if k else np.nan,
                "max": float(values.max()) if k else np.nan,
                "mean": mean,
                "sd": sd,
                "cv": sd / abs(mean) if k >= 2 and mean != 0 else np.nan,
                "status": OK if k >= 2 else NOT_ESTIMABLE,
                "reason": "" if k >= 2 else "estimated in fewer than 2 runs",
            }
        )
    return pd.DataFrame(rows)[SPREAD_COLUMNS].reset_index(drop=True)


__all__ = ["CELL_COLUMNS", "SPREAD_COLUMNS", "cell_estimates", "spread"]
