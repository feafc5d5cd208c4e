"""The passage bank: reviewable YAML per language -> one tidy passage table.

Each passage is first person, speaker-anonymous, and carries a masculine, neutral
or feminine stereotype in its content (S2S paper, sec. 3.2). Lengths are
information-matched: words for English and Spanish, CJK characters for Mandarin.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from voicebias.validation import ValidationReport, expectations, require_valid, where

LANGS = ("en", "es", "zh")
POLES = ("masculine", "neutral", "feminine")
POLE_ORDINAL = {"masculine": 0, "neutral": 1, "feminine": 2}
PASSAGE_COLUMNS = [
    "passage_id", "lang", "pole", "theme", "seed_term", "seed_source", "seed_statistic",
    "statistic_checked", "text", "gloss_en", "length_units", "intensity", "rated_by", "review_status",
]
_CJK = re.compile(r"[\u4e00-\u9fff]")
_WORD = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*", re.UNICODE)

# Third-person and speaker-revealing words that must never occur in a passage
# (a first gate; the per-language linters deepen it).
GENDERED_REGEX = {
    "en": r"(?i)\b(?:he|she|him|her|his|hers|himself|herself|man|woman|men|women|husband|wife|boyfriend|girlfriend|mother|father|mom|dad|son|daughter|brother|sister)\b",
    "es": r"(?i)\b(?:él|ella|ellos|ellas|esposo|esposa|marido|novio|novia|hombre|mujer)\b",
    "zh": r"(?:他|她|丈夫|妻子|老公|老婆|男人|女人)",
}


def length_units(text: str, lang: str) -> int:
    """Words (en, es) or CJK characters (zh)."""
    if lang == "zh":
        return len(_CJK.findall(text))
    return len(_WORD.findall(text))


def load_bank(bank_dir: Path | str, languages: tuple[str, ...] | list[str] = LANGS) -> pd.DataFrame:
    """Read <bank_dir>/<lang>.yaml for each language into one passage table."""
    rows: list[dict[str, Any]] = []
    for lang in languages:
        path = Path(bank_dir) / f"{lang}.yaml"
        if not path.exists():
            raise FileNotFoundError(f"passage bank for '{lang}' not found: {path}")
        with open(path, encoding="utf-8") as fh:
            entries = yaml.safe_load(fh) or []
        if not isinstance(entries, list):
            raise ValueError(f"{path}: expected a list of passages")
        for i, e in enumerate(entries):
            if not isinstance(e, dict) or "text" not in e:
                raise ValueError(f"{path}: entry {i} is not a passage mapping with a 'text' field")
            rows.append(dict(e))
    df = pd.DataFrame(rows)
    for col in PASSAGE_COLUMNS:
        if col not in df:
            df[col] = None
    df["text"] = df["text"].astype(str).str.strip()
    df["gloss_en"] = df["gloss_en"].where(df["gloss_en"].notna(), None)
    df["length_units"] = [length_units(t, l) for t, l in zip(df["text"], df["lang"])]
    return df[PASSAGE_COLUMNS].sort_values(["lang", "pole", "passage_id"]).reset_index(drop=True)


def passage_expectations(length_window: dict[str, list[int]], languages=LANGS) -> list:
    E = expectations()
    exps = [
        E.ExpectTableColumnsToMatchSet(column_set=PASSAGE_COLUMNS, exact_match=True),
        E.ExpectColumnValuesToBeUnique(column="passage_id"),
        E.ExpectColumnValuesToNotBeNull(column="text"),
        E.ExpectColumnValuesToNotBeNull(column="gloss_en"),
        E.ExpectColumnValuesToBeInSet(column="lang", value_set=list(languages)),
        E.ExpectColumnValuesToBeInSet(column="pole", value_set=list(POLES)),
        E.ExpectCompoundColumnsToBeUnique(column_list=["lang", "theme"]),
        E.ExpectColumnValuesToNotMatchRegex(column="gloss_en", regex=GENDERED_REGEX["en"]),
    ]
    for lang in languages:
        lo, hi = length_window[lang]
        exps.append(E.ExpectColumnValuesToBeBetween(
            column="length_units", min_value=lo, max_value=hi, row_condition=where("lang", lang),
        ))
        exps.append(E.ExpectColumnValuesToNotMatchRegex(
            column="text", regex=GENDERED_REGEX[lang], row_condition=where("lang", lang),
        ))
    return exps


def validate_passages(df: pd.DataFrame, length_window: dict[str, list[int]], languages=LANGS) -> ValidationReport:
    """Stop with a readable summary when the passage table breaks its suite."""
    report = require_valid(df, "passages", passage_expectations(length_window, languages))
    cells = df.groupby(["lang", "pole"]).size()
    missing = [(l, p) for l in languages for p in POLES if (l, p) not in cells.index]
    if missing:
        from voicebias.validation import ValidationFailed

        raise ValidationFailed(f"suite 'passages': no passages for cells {missing}")
    return report


def run_stage(params: dict[str, Any], bank_dir: Path, out_table: Path, metrics_path: Path) -> pd.DataFrame:
    """Stage 'bank': read, validate and write the passage table."""
    from voicebias.io import write_json, write_table

    languages = params["base"]["languages"]
    df = load_bank(bank_dir, languages)
    report = validate_passages(df, params["bank"]["length_window"], languages)
    write_table(out_table, df)
    counts = df.groupby(["lang", "pole"]).size()
    write_json(metrics_path, {
        "passages": int(len(df)),
        "per_cell": {f"{l}_{p}": int(n) for (l, p), n in counts.items()},
        "expectations_passed": report.n_expectations,
    })
    return df
