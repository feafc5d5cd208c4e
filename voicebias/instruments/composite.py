"""The femininity composite: equal-weight mean of z-scored gender-sensitive measures.

It averages z-scored F0 (semitones re 100 Hz), one formant term (params acoustics.formant_term:
the vocal-tract index from F3-F4 or the formant index over F1-F3, octaves re adult-male norms)
and every configured classifier's margin, each with weight 1 / (2 + number of classifiers) (S2S
paper, sec. 4), standardised per language with the mean and SD of that language's input stimuli,
so inputs and outputs share one scale. Units: SD of the language's input distribution; higher =
more feminine.

See docs/instrument.md, "The femininity composite".
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from voicebias.contract import FORMANT_TERMS
from voicebias.errors import ConfigError, NotFound

REFERENCE_COLUMNS = ["lang", "measure", "mean", "sd", "n"]


def composite_measures(classifiers: list[str] | str, formant_term: str) -> list[str]:
    """The measures the composite averages: F0, the formant term (vtl_index or formant_index,
    voicebias.contract.FORMANT_TERMS), one margin per classifier."""
    if formant_term not in FORMANT_TERMS:
        raise ConfigError(f"unknown formant term '{formant_term}': choose one of {', '.join(FORMANT_TERMS)}")
    names = [classifiers] if isinstance(classifiers, str) else list(classifiers)
    return ["f0_median_st", formant_term, *[f"margin_{c}" for c in names]]


def reference_stats(inputs: pd.DataFrame, measures: list[str]) -> pd.DataFrame:
    """Per-language mean and SD (ddof=1) of each measure over the measured input stimuli.

    Returns one row per language x measure: lang, measure, mean, sd, n.
    """
    missing = [m for m in measures if m not in inputs]
    if missing:
        raise NotFound(f"cannot build the composite reference: no column(s) {', '.join(missing)}")
    ok = inputs[inputs["status"] == "ok"]
    if ok.empty:
        raise ConfigError("cannot build the composite reference: no input stimulus was measured")
    rows = []
    for lang, g in ok.groupby("lang"):
        for m in measures:
            values = g[m].dropna()
            sd = float(values.std(ddof=1))
            if not np.isfinite(sd) or sd == 0:
                raise ConfigError(f"cannot standardise {m} for '{lang}': no spread in the reference stimuli")
            rows.append({"lang": lang, "measure": m, "mean": float(values.mean()), "sd": sd, "n": int(len(values))})
    return pd.DataFrame(rows, columns=REFERENCE_COLUMNS)


def zscores(df: pd.DataFrame, reference: pd.DataFrame, measures: list[str]) -> pd.DataFrame:
    """Each measure standardised against the reference of its row's language (SD units)."""
    ref = reference.set_index(["lang", "measure"])
    langs = set(df["lang"].dropna().unique())
    known = set(reference["lang"])
    if langs - known:
        raise NotFound(
            f"no composite reference for language(s) {', '.join(sorted(langs - known))}; "
            f"the reference covers {', '.join(sorted(known))}"
        )
    out = {}
    for m in measures:
        if m not in set(reference["measure"]):
            raise NotFound(f"the composite reference has no measure '{m}'")
        mean = df["lang"].map(lambda lang: ref.loc[(lang, m), "mean"])
        sd = df["lang"].map(lambda lang: ref.loc[(lang, m), "sd"])
        out[m] = (df[m] - mean) / sd
    return pd.DataFrame(out, index=df.index)


def femininity_composite(df: pd.DataFrame, reference: pd.DataFrame, measures: list[str]) -> pd.Series:
    """Composite per row (SD units): the equal-weight mean of the z-scored measures, NaN
    where any of them is missing."""
    return zscores(df, reference, measures).mean(axis=1, skipna=False).rename("composite")
