"""The S2S paper's published figures, and a check of an analysis folder against them.

*Voice or Stereotype?* (the S2S paper) prints its results rounded: odds ratios to one decimal,
rates as whole percentages or two decimals, counts exactly. Each figure it gives in its text and
table captions for its five systems is one :class:`Figure` here: where it is printed, the analysis
table and cell that hold the same quantity, and the interval a re-analysis of the same replies must
land in. A printed value v with d decimals accepts [v - 0.5 * 10^-d, v + 0.5 * 10^-d] (the values
that round to it); a printed range or bound ("1.7-3.4", ">= 20 %") accepts the same half unit of
slack at each end; a count is matched exactly. `check_published(analysis_dir)` compares a folder's
tables (reports/analysis) with every figure whose system it holds; `voicebias replicate` prints one
PASS/FAIL line per figure. Figures the text gives without saying which table row holds them (the
pooled RQ1 contrast, the 4 of 40 significant fits) are not listed, nor is Table 8's "92 % of
summaries inject one": with 180 summaries per system, 76 % (GLM-4-Voice), 81 % (Step-Audio-2) and
about 100 % for the other three pool to at most 91.6 %. docs/reproducibility.md, "The S2S paper's
published figures".

System names are this project's card names for the paper's five systems: gpt_audio (gpt-audio),
gemini_live (Gemini), glm4_voice (GLM-4-Voice), step_audio2 (Step-Audio-2), kimi_audio
(Kimi-Audio).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

#: the S2S paper's five systems, by this project's card names
PAPER_SYSTEMS = ("gpt_audio", "gemini_live", "glm4_voice", "step_audio2", "kimi_audio")
OPEN_SYSTEMS = ("glm4_voice", "step_audio2", "kimi_audio")


def printed(value: float, decimals: int) -> tuple[float, float]:
    """The values that round to `value` printed with `decimals` decimals.

    >>> printed(21.9, 1)
    (21.85, 21.95)
    """
    half = 0.5 * 10.0**-decimals
    return (round(value - half, decimals + 2), round(value + half, decimals + 2))


def between(low: float, high: float, decimals: int) -> tuple[float, float]:
    """A printed range [low, high], each end with its half unit of rounding."""
    return (printed(low, decimals)[0], printed(high, decimals)[1])


@dataclass(frozen=True)
class Figure:
    """One published figure: `says` (as printed), `where` (section or caption), the analysis `table`,
    the row (`row`: column -> value) and `column` that hold it, in the table's own unit, and the
    accepted [low, high]."""

    says: str
    where: str
    table: str
    row: dict[str, Any]
    column: str
    accepted: tuple[float, float]


def _or(system: str, lang: str, says: str, where: str, accepted: tuple[float, float]) -> Figure:
    return Figure(says, where, "describe_odds_ratios.csv", {"system": system, "lang": lang}, "odds_ratio", accepted)


def _misgender(system: str, lang: str, cell: str, says: str, where: str, accepted: tuple[float, float]) -> Figure:
    return Figure(
        says, where, "describe_misgender.csv", {"system": system, "lang": lang, "cell_type": cell}, "rate", accepted
    )


S41 = "S2S paper, section 4.1"
T2 = "S2S paper, Table 2 caption"
T7 = "S2S paper, Table 7 note d"
T8 = "S2S paper, Table 8 caption"

FIGURES: tuple[Figure, ...] = (
    _or("gpt_audio", "ALL", "gpt-audio OR = 21.9 per content step", S41, printed(21.9, 1)),
    _or("gemini_live", "ALL", "Gemini OR = 24.3 per content step", S41, printed(24.3, 1)),
    *(_or(s, "ALL", "open models' OR = 1.7-3.4 per content step", S41, between(1.7, 3.4, 1)) for s in OPEN_SYSTEMS),
    _or("kimi_audio", "en", "Kimi-Audio's English OR = 1.0", S41, printed(1.0, 1)),
    *(
        Figure(
            "n = 161-180 of 180 compliant describe answers per model",
            "S2S paper, Limitations",
            "describe_odds_ratios.csv",
            {"system": s, "lang": "ALL"},
            "n",
            (161.0, 180.0),
        )
        for s in PAPER_SYSTEMS
    ),
    Figure(
        "GLM-4-Voice: 41 of 60 Spanish describe answers scoreable",
        S41,
        "describe_odds_ratios.csv",
        {"system": "glm4_voice", "lang": "es"},
        "n",
        (41.0, 41.0),
    ),
    _misgender("gpt_audio", "en", "misaligned", "gpt-audio misgenders every misaligned English clip", S41, (1.0, 1.0)),
    *(
        _misgender(
            "gpt_audio", lang, "misaligned", "gpt-audio: 83-100 % misaligned misgender", S41, between(0.83, 1.0, 2)
        )
        for lang in ("en", "es", "zh")
    ),
    _misgender("kimi_audio", "zh", "misaligned", "Kimi-Audio: 55 % misgender in Mandarin", S41, printed(0.55, 2)),
    _misgender("kimi_audio", "es", "misaligned", "Kimi-Audio: zero misaligned errors in Spanish", T7, (0.0, 0.0)),
    *(
        _misgender(s, "zh", "misaligned", "Mandarin: misaligned misgender >= 20 % for all five", S41, (0.195, 1.0))
        for s in PAPER_SYSTEMS
    ),
    *(
        _misgender(s, "ALL", "aligned", "aligned cells: 0-36 % error", S41, between(0.0, 0.36, 2))
        for s in PAPER_SYSTEMS
    ),
    Figure(
        "Kimi-Audio: Delta_pp = .28 in Mandarin",
        S41,
        "summarize_pronouns_by_lang.csv",
        {"system": "kimi_audio", "lang": "zh"},
        "delta_pp",
        printed(28.0, 0),
    ),
    Figure(
        "GLM-4-Voice injects a pronoun in 50 % of its Spanish summaries",
        T2,
        "summarize_pronouns_by_lang.csv",
        {"system": "glm4_voice", "lang": "es"},
        "injection_rate",
        printed(0.50, 2),
    ),
    Figure(
        "GLM-4-Voice injects a pronoun in 76 % of summaries",
        T8,
        "summarize_pronouns.csv",
        {"system": "glm4_voice"},
        "injection_rate",
        printed(0.76, 2),
    ),
    Figure(
        "Step-Audio-2 injects a pronoun in 81 % of summaries",
        T8,
        "summarize_pronouns.csv",
        {"system": "step_audio2"},
        "injection_rate",
        printed(0.81, 2),
    ),
    *(
        Figure(
            f"Gemini: 'she' >= 83 % for a female voice ({pole} content)",
            T8,
            "summarize_pronouns.csv",
            {"system": "gemini_live"},
            f"p_she_{pole}_female_voice",
            (0.825, 1.0),
        )
        for pole in ("masculine", "neutral", "feminine")
    ),
)


def _value(table: pd.DataFrame, fig: Figure) -> tuple[float | None, str]:
    """(the table's value of the figure, '' or why there is none)."""
    mask = pd.Series(True, index=table.index)
    for col, want in fig.row.items():
        if col not in table:
            return None, f"{fig.table} has no column {col}"
        mask &= table[col].astype(str) == str(want)
    rows = table[mask]
    if fig.column not in table:
        return None, f"{fig.table} has no column {fig.column}"
    if rows.empty:
        return None, f"{fig.table} has no row {fig.row}"
    if len(rows) > 1:
        return None, f"{fig.table} has {len(rows)} rows {fig.row}"
    value = float(pd.to_numeric(rows[fig.column], errors="coerce").iloc[0])
    return (value, "") if np.isfinite(value) else (None, f"{fig.table}: {fig.column} is not estimable")


def check_published(analysis_dir: Path, figures: tuple[Figure, ...] = FIGURES) -> list[dict[str, Any]]:
    """One entry per figure whose system the folder's table holds: `says`, `where`, `value` (the
    folder's), `accepted` and `ok`; a figure whose cell is missing or not estimable fails, saying so.
    Empty when the folder audits none of the paper's systems."""
    from voicebias.io import read_table

    tables: dict[str, pd.DataFrame] = {}
    out = []
    for fig in figures:
        path = Path(analysis_dir) / fig.table
        if fig.table not in tables:
            tables[fig.table] = read_table(path) if path.exists() else pd.DataFrame(columns=["system"])
        held = set(tables[fig.table]["system"].astype(str)) if "system" in tables[fig.table] else set()
        if str(fig.row["system"]) not in held:
            continue
        value, why = _value(tables[fig.table], fig)
        low, high = fig.accepted
        ok = value is not None and low - 1e-12 <= value <= high + 1e-12
        out.append(
            {"says": fig.says, "where": fig.where, "value": value, "accepted": fig.accepted, "ok": ok, "why": why}
        )
    return out


__all__ = ["FIGURES", "Figure", "OPEN_SYSTEMS", "PAPER_SYSTEMS", "between", "check_published", "printed"]
