"""The passage bank: reviewable YAML per language -> one tidy passage table.

Each passage is first person, speaker-anonymous, and carries a masculine, neutral
or feminine stereotype in its content (S2S paper, sec. 3.2). Lengths are
information-matched: words for English and Spanish, CJK characters for Mandarin.

The bank's Great Expectations suite ('passages') checks the schema, the length
windows, one theme per passage and every neutrality rule of `voicebias.stimuli.lint`
(one column per rule, named after it, so a failure names the rule that fired).
`render_markdown` prints the bank for a human reviewer, language by language:

    python -m voicebias.stimuli.bank render --out reports/bank/bank.md
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.contract import LANGUAGES, PASSAGE_COLUMNS, POLES
from voicebias.errors import ConfigError
from voicebias.io import read_yaml
from voicebias.params import load_params
from voicebias.validation import ValidationReport, expectations, require_valid, where

_CJK = re.compile(r"[\u4e00-\u9fff]")
_WORD = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*", re.UNICODE)

# Third-person and speaker-revealing words that must never occur in a passage
# (a first gate; the per-language linters deepen it).
GENDERED_REGEX = {
    "en": r"(?i)\b(?:he|she|him|her|his|hers|himself|herself|man|woman|men|women|husband|wife|boyfriend|girlfriend"
    r"|mother|father|mom|dad|son|daughter|brother|sister)\b",
    "es": r"(?i)\b(?:él|ella|ellos|ellas|esposo|esposa|marido|novio|novia|hombre|mujer)\b",
    "zh": r"(?:他|她|丈夫|妻子|老公|老婆|男人|女人)",
}


def length_units(text: str, lang: str) -> int:
    """Words (en, es) or CJK characters (zh)."""
    if lang == "zh":
        return len(_CJK.findall(text))
    return len(_WORD.findall(text))


def load_bank(bank_dir: Path | str, languages: tuple[str, ...] | list[str] = LANGUAGES) -> pd.DataFrame:
    """Read <bank_dir>/<lang>.yaml for each language into one passage table."""
    rows: list[dict[str, Any]] = []
    for lang in languages:
        path = Path(bank_dir) / f"{lang}.yaml"
        if not path.exists():
            raise FileNotFoundError(f"passage bank for '{lang}' not found: {path}")
        entries = read_yaml(path) or []
        if not isinstance(entries, list):
            raise ConfigError(f"{path}: expected a list of passages")
        for i, e in enumerate(entries):
            if not isinstance(e, dict) or "text" not in e:
                raise ConfigError(f"{path}: entry {i} is not a passage mapping with a 'text' field")
            rows.append(dict(e))
    df = pd.DataFrame(rows)
    for col in PASSAGE_COLUMNS:
        if col not in df:
            df[col] = None
    df["text"] = df["text"].astype(str).str.strip()
    df["gloss_en"] = df["gloss_en"].where(df["gloss_en"].notna(), None)
    df["length_units"] = [length_units(t, lang) for t, lang in zip(df["text"], df["lang"])]
    return df[PASSAGE_COLUMNS].sort_values(["lang", "pole", "passage_id"]).reset_index(drop=True)


def passage_expectations(length_window: dict[str, list[int]], languages=LANGUAGES, with_lint: bool = True) -> list:
    """The 'passages' suite; with_lint adds one null-check per neutrality rule column
    (validate the table `lint.lint_table` returns)."""
    from voicebias.stimuli.lint import lint_expectations, rule_columns

    E = expectations()
    columns = PASSAGE_COLUMNS + (rule_columns(languages) if with_lint else [])
    exps = [
        E.ExpectTableColumnsToMatchSet(column_set=columns, exact_match=True),
        E.ExpectColumnValuesToBeUnique(column="passage_id"),
        E.ExpectColumnValuesToNotBeNull(column="text"),
        E.ExpectColumnValuesToNotBeNull(column="gloss_en"),
        E.ExpectColumnValuesToBeInSet(column="lang", value_set=list(languages)),
        E.ExpectColumnValuesToBeInSet(column="pole", value_set=list(POLES)),
        E.ExpectCompoundColumnsToBeUnique(column_list=["lang", "theme"]),
        E.ExpectColumnValuesToNotMatchRegex(column="gloss_en", regex=GENDERED_REGEX["en"]),
        E.ExpectColumnValuesToNotBeNull(column="seed_source"),
    ]
    # stereotyped themes are seeded from a documented gender skew: name the statistic
    for pole in ("masculine", "feminine"):
        exps.append(E.ExpectColumnValuesToNotBeNull(column="seed_statistic", row_condition=where("pole", pole)))
    for lang in languages:
        lo, hi = length_window[lang]
        exps.append(
            E.ExpectColumnValuesToBeBetween(
                column="length_units",
                min_value=lo,
                max_value=hi,
                row_condition=where("lang", lang),
            )
        )
        exps.append(
            E.ExpectColumnValuesToNotMatchRegex(
                column="text",
                regex=GENDERED_REGEX[lang],
                row_condition=where("lang", lang),
            )
        )
    if with_lint:
        exps += lint_expectations(languages)
    return exps


def validate_passages(df: pd.DataFrame, length_window: dict[str, list[int]], languages=LANGUAGES) -> ValidationReport:
    """Stop with a readable summary when the passage table breaks its suite.

    The summary names each failed rule as its column (e.g. 'es_speaker_agreement')
    with examples 'passage_id: offending words'.
    """
    from voicebias.stimuli.lint import lint_table

    table = lint_table(df, languages)
    report = require_valid(table, "passages", passage_expectations(length_window, languages))
    cells = df.groupby(["lang", "pole"]).size()
    missing = [(lang, p) for lang in languages for p in POLES if (lang, p) not in cells.index]
    if missing:
        from voicebias.validation import ValidationFailed

        raise ValidationFailed(f"suite 'passages': no passages for cells {missing}")
    return report


LANG_NAMES = {"en": "English", "es": "Spanish", "zh": "Mandarin"}
_UNITS = {"en": "words", "es": "words", "zh": "characters"}


def _field(v: Any) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "—"
    return str(v)


def render_markdown(df: pd.DataFrame, length_window: dict[str, list[int]] | None = None) -> str:
    """The bank as plain Markdown, one section per language and pole, each passage
    with its text, English gloss and provenance (seed, statistic, rating, review)."""
    lines = [
        "# Passage bank",
        "",
        f"{len(df)} passages. Generated from data/bank/*.yaml by `python -m voicebias.stimuli.bank render`; "
        "edit the YAML, not this file.",
        "",
    ]
    for lang in [x for x in LANGUAGES if x in set(df["lang"])]:
        sub = df[df["lang"] == lang]
        window = f"; window {length_window[lang][0]}-{length_window[lang][1]} {_UNITS[lang]}" if length_window else ""
        lines += [f"## {LANG_NAMES.get(lang, lang)} ({lang}): {len(sub)} passages{window}", ""]
        for pole in POLES:
            cell = sub[sub["pole"] == pole].sort_values("passage_id")
            if cell.empty:
                continue
            lines += [f"### {pole} ({len(cell)})", ""]
            for p in cell.itertuples(index=False):
                lines += [
                    f"#### {p.passage_id}: {_field(p.theme)}",
                    "",
                    f"> {p.text}",
                    "",
                ]
                if lang != "en":
                    lines += [f"*Gloss:* {_field(p.gloss_en)}", ""]
                checked = "checked" if p.statistic_checked is True else "not yet checked"
                lines += [
                    f"- length: {length_units(p.text, lang)} {_UNITS[lang]}",
                    f"- seed: {_field(p.seed_term)}; {_field(p.seed_statistic)} ({checked})",
                    f"- source: {_field(p.seed_source)}",
                    f"- intensity: {_field(p.intensity)} (rated by {_field(p.rated_by)})",
                    f"- review status: {_field(p.review_status)}",
                    "",
                ]
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    """`python -m voicebias.stimuli.bank render|lint`: review the bank without running the pipeline."""
    import argparse

    from voicebias import config

    ap = argparse.ArgumentParser(prog="python -m voicebias.stimuli.bank", description="Review the passage bank.")
    ap.add_argument(
        "action", choices=["render", "lint"], help="render: Markdown for reviewers; lint: list every rule hit"
    )
    ap.add_argument("--bank-dir", default=str(config.BANK_DIR))
    ap.add_argument("--lang", action="append", choices=list(LANGUAGES), help="only these languages (repeatable)")
    ap.add_argument("--out", help="write to this file instead of standard output")
    args = ap.parse_args(argv)
    languages = args.lang or list(LANGUAGES)
    df = load_bank(args.bank_dir, languages)
    if args.action == "render":
        try:
            window = load_params()["bank"]["length_window"]
        except (FileNotFoundError, KeyError):
            window = None
        text = render_markdown(df, window)
    else:
        from voicebias.stimuli.lint import lint_hits

        hits = lint_hits(df, languages)
        text = (
            "no rule fired on any passage\n" if hits.empty else hits.to_string(index=False) + f"\n{len(hits)} hit(s)\n"
        )
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0 if args.action == "render" or text.startswith("no rule") else 1


if __name__ == "__main__":
    import sys

    sys.exit(main())
