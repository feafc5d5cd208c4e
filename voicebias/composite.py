"""The femininity composite: equal-weight mean of z-scored gender-sensitive measures.

Following the S2S paper (sec. 4, RQ1), the composite averages z-scored F0, a formant
index and the classifiers' margins. Every measure is standardised against the
input stimuli of the same language (mean and SD over all voiced passages of that
language, both voices), so outputs scored later share the inputs' scale. Units:
SD of the language's input distribution; higher = more feminine.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def composite_measures(classifiers: list[str]) -> list[str]:
    return ["f0_median_st", "formant_index", *[f"margin_{c}" for c in classifiers]]


def reference_stats(inputs: pd.DataFrame, measures: list[str]) -> pd.DataFrame:
    """Per-language mean and SD of each measure over the measured input stimuli."""
    ok = inputs[inputs["status"] == "ok"]
    rows = []
    for lang, g in ok.groupby("lang"):
        for m in measures:
            sd = float(g[m].std(ddof=1))
            if not np.isfinite(sd) or sd == 0:
                raise ValueError(f"cannot standardise {m} for '{lang}': no spread in the reference stimuli")
            rows.append({"lang": lang, "measure": m, "mean": float(g[m].mean()), "sd": sd, "n": len(g)})
    return pd.DataFrame(rows)


def femininity_composite(df: pd.DataFrame, reference: pd.DataFrame, measures: list[str]) -> pd.Series:
    """Composite per row (SD units) using the reference of each row's language."""
    ref = reference.set_index(["lang", "measure"])
    zs = []
    for m in measures:
        mean = df["lang"].map(lambda l: ref.loc[(l, m), "mean"])
        sd = df["lang"].map(lambda l: ref.loc[(l, m), "sd"])
        zs.append((df[m] - mean) / sd)
    return pd.concat(zs, axis=1).mean(axis=1, skipna=False)
