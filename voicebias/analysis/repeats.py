"""Repeats: several answers per item (params.yaml `run.samples_per_item` > 1).

The respond stage then draws k seeded answers per stimulus, and the responses, scored and acoustic
tables carry a `sample` column. The item (one system x task x stimulus) stays the unit of every
analysis: each first reduces an item's samples to one value (`item_means`, item shares), or treats
the item as the independent unit. `between_sample_variance` reports how much the answers of one
item vary (the analysis stage's repeats_variance.csv).

How each analysis keeps the item as its unit, and the variance table: docs/repeats.md.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from voicebias.contract import SAMPLE

#: the columns that name one item of the S2S tables
ITEM_KEYS = ("system", "task", "stimulus_id")


def has_repeats(table: pd.DataFrame) -> bool:
    """Whether a responses, scored or acoustic table holds several samples per item (a `sample` column)."""
    return SAMPLE in table.columns


def item_means(table: pd.DataFrame, values: Iterable[str], keys: Iterable[str] = ITEM_KEYS) -> pd.DataFrame:
    """One row per item: each column of `values` averaged over the item's samples (missing values
    left out), every other column the item's first non-missing value, and n_samples the rows
    averaged. Items keep the order of their first row; the sample column is dropped. The mean
    is taken about the item's first value, so an item whose samples agree keeps that value
    to the last bit.

    Examples
    --------
    >>> t = pd.DataFrame({"system": "s", "task": "readback", "stimulus_id": ["a", "a", "a", "b"],
    ...                   "sample": [0, 1, 2, 0], "pole": ["neutral"] * 3 + ["feminine"],
    ...                   "delta_composite": [0.1, 0.3, np.nan, 1.0]})
    >>> print(item_means(t, ["delta_composite"]).to_string(index=False))
    system     task stimulus_id     pole  delta_composite  n_samples
         s readback           a  neutral              0.2          3
         s readback           b feminine              1.0          1
    """
    keys, values = list(keys), list(values)
    t = table.drop(columns=[SAMPLE], errors="ignore")
    grouped = t.groupby(keys, sort=False)
    out = grouped.first()
    for v in values:
        offset = (t[v] - grouped[v].transform("first")).groupby([t[k] for k in keys], sort=False).mean()
        out[v] = out[v] + offset
    out["n_samples"] = grouped.size()
    return out.reset_index()


VARIANCE_COLUMNS = [
    "system",
    "task",
    "metric",
    "n_items",
    "n_answers",
    "samples_per_item",
    "mean",
    "within_variance",
    "between_variance",
    "total_variance",
    "within_share",
]


def variance_components(values: np.ndarray, items: np.ndarray) -> dict[str, float]:
    """One-way random-effects variance components of answers `values` grouped by `items`.

    The ANOVA (method-of-moments) estimators of the one-way random-effects model with
    unbalanced groups: MSW = SSW / (N - n), MSB = SSB /
    (n - 1), within_variance = MSW (the variance of the answers of one item, pooled over
    items), between_variance = max(0, (MSB - MSW) / k0) with k0 = (N - sum k_i^2 / N) /
    (n - 1), and within_share = within / (within + between): the share of the answers'
    variance that lies between the samples of an item (1 - the intraclass correlation).
    N answers, n items, k_i answers of item i. NaN where a component is not estimable
    (no item with two answers; fewer than two items).

    Examples
    --------
    >>> v = variance_components(np.array([1., 2, 3, 5, 6, 7]), np.array(list("aaabbb")))
    >>> {k: round(x, 4) for k, x in v.items()}
    {'within_variance': 1.0, 'between_variance': 7.6667, 'total_variance': 8.6667, 'within_share': 0.1154}
    """
    values = np.asarray(values, float)
    codes, first, idx = np.unique(np.asarray(items), return_index=True, return_inverse=True)
    n, N = len(codes), len(values)
    k = np.bincount(idx, minlength=n).astype(float)
    # about each item's first value, so the samples of an item that agree add exactly 0
    dev = values - values[first][idx]
    mean_dev = np.bincount(idx, weights=dev, minlength=n) / k
    means = values[first] + mean_dev
    ssw = float(np.sum((dev - mean_dev[idx]) ** 2))
    within = ssw / (N - n) if N > n else np.nan
    if n > 1 and np.isfinite(within):
        grand = float(values.mean())
        msb = float(np.sum(k * (means - grand) ** 2)) / (n - 1)
        k0 = (N - float(np.sum(k**2)) / N) / (n - 1)
        between = max(0.0, (msb - within) / k0)
    else:
        between = np.nan
    total = within + between
    share = within / total if np.isfinite(total) and total > 0 else np.nan
    return {"within_variance": within, "between_variance": between, "total_variance": total, "within_share": share}


def between_sample_variance(long: pd.DataFrame) -> pd.DataFrame:
    """How much the answers of one item vary, per system x task x metric (VARIANCE_COLUMNS).

    `long` holds one value per answer (system, task, stimulus_id, metric, value), as the
    disaggregated table's item table with repeats (voicebias.analysis.disaggregated.s2s_items):
    describe misgender_rate (1 when a compliant answer misgenders the voice), summarize
    injection_rate and p_she, and the RQ1 measures of each acoustically scored task.
    n_items counts the items with an answer, n_answers the answers, samples_per_item their
    mean per item; mean is the mean over items of the item means; the components are
    `variance_components`.
    """
    rows = []
    for (system, task, metric), g in long.groupby(["system", "task", "metric"], sort=True):
        per_item = g.groupby("stimulus_id")["value"]
        rows.append(
            {
                "system": system,
                "task": task,
                "metric": metric,
                "n_items": int(per_item.ngroups),
                "n_answers": int(len(g)),
                "samples_per_item": float(len(g) / per_item.ngroups),
                "mean": float(per_item.mean().mean()),
                **variance_components(g["value"].to_numpy(float), g["stimulus_id"].to_numpy()),
            }
        )
    return pd.DataFrame(rows, columns=VARIANCE_COLUMNS)
