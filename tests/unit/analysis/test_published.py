"""The S2S paper's published figures against an analysis folder: every figure the paper prints for
its five systems, matched within the rounding of its print."""

from __future__ import annotations

import pandas as pd
import pytest

from voicebias.analysis.published import FIGURES, PAPER_SYSTEMS, between, check_published, printed
from voicebias.io import write_table


def _paper_tables(folder):
    """Analysis tables holding, for the paper's five systems, the values the paper prints (a value for
    every figure, inside its accepted interval)."""
    ors = {"gpt_audio": 21.9, "gemini_live": 24.3, "glm4_voice": 1.7, "step_audio2": 2.5, "kimi_audio": 3.4}
    odds = [{"system": s, "lang": "ALL", "n": 170, "odds_ratio": ors[s]} for s in PAPER_SYSTEMS]
    odds += [{"system": "kimi_audio", "lang": "en", "n": 58, "odds_ratio": 1.0}]
    odds += [{"system": "glm4_voice", "lang": "es", "n": 41, "odds_ratio": 2.0}]
    mis = [{"system": s, "lang": "ALL", "cell_type": "aligned", "rate": 0.1} for s in PAPER_SYSTEMS]
    mis += [{"system": s, "lang": "zh", "cell_type": "misaligned", "rate": 0.3} for s in PAPER_SYSTEMS]
    mis += [{"system": "gpt_audio", "lang": "en", "cell_type": "misaligned", "rate": 1.0}]
    mis += [{"system": "gpt_audio", "lang": "es", "cell_type": "misaligned", "rate": 0.83}]
    mis += [{"system": "kimi_audio", "lang": "es", "cell_type": "misaligned", "rate": 0.0}]
    mis = [r | {"rate": 0.55} if (r["system"], r["lang"]) == ("kimi_audio", "zh") else r for r in mis]
    mis = [r | {"rate": 0.9} if (r["system"], r["lang"]) == ("gpt_audio", "zh") else r for r in mis]
    by_lang = [
        {"system": "kimi_audio", "lang": "zh", "n": 60, "injection_rate": 1.0, "delta_pp": 28.0},
        {"system": "glm4_voice", "lang": "es", "n": 60, "injection_rate": 0.5, "delta_pp": 10.0},
    ]
    inj = {"gpt_audio": 1.0, "gemini_live": 1.0, "glm4_voice": 0.76, "step_audio2": 0.81, "kimi_audio": 1.0}
    pron = [
        {"system": s, "n": 180, "injection_rate": inj[s]}
        | {
            f"p_she_{p}_female_voice": (0.83 if s == "gemini_live" else 0.5)
            for p in ("masculine", "neutral", "feminine")
        }
        for s in PAPER_SYSTEMS
    ]
    tables = {
        "describe_odds_ratios.csv": pd.DataFrame(odds),
        "describe_misgender.csv": pd.DataFrame(mis),
        "summarize_pronouns_by_lang.csv": pd.DataFrame(by_lang),
        "summarize_pronouns.csv": pd.DataFrame(pron),
    }
    for name, t in tables.items():
        write_table(folder / name, t)
    return folder


def test_every_printed_figure_passes_on_tables_holding_the_printed_values(tmp_path):
    got = check_published(_paper_tables(tmp_path))
    assert len(got) == len(FIGURES)
    assert all(g["ok"] for g in got), [g for g in got if not g["ok"]]


@pytest.mark.parametrize(
    "change, says",
    [
        (
            {("describe_odds_ratios.csv", "gpt_audio", "ALL", "odds_ratio"): 22.0},
            "gpt-audio OR = 21.9 per content step",
        ),
        ({("describe_misgender.csv", "kimi_audio", "zh", "rate"): 0.5}, "Kimi-Audio: 55 % misgender in Mandarin"),
        ({("describe_odds_ratios.csv", "glm4_voice", "es", "n"): 40}, "GLM-4-Voice: 41 of 60 Spanish describe answers"),
        ({("summarize_pronouns.csv", "step_audio2", None, "injection_rate"): 0.9}, "Step-Audio-2 injects"),
    ],
)
def test_one_value_off_by_a_printed_unit_fails_that_figure_alone(tmp_path, change, says):
    from voicebias.io import read_table

    folder = _paper_tables(tmp_path)
    for (name, system, lang, column), value in change.items():
        t = read_table(folder / name)
        at = (t["system"] == system) & ((t["lang"] == lang) if lang is not None else True)
        t.loc[at, column] = value
        write_table(folder / name, t)
    failed = [g["says"] for g in check_published(folder) if not g["ok"]]
    assert failed and all(f.startswith(says) for f in failed), failed


def test_the_accepted_interval_is_the_rounding_of_the_print():
    assert printed(21.9, 1) == (21.85, 21.95)
    assert printed(0.55, 2) == (0.545, 0.555)
    assert between(1.7, 3.4, 1) == (1.65, 3.45)
    lo, hi = printed(21.9, 1)
    assert lo <= 21.949 <= hi and not lo <= 21.951 <= hi


def test_a_missing_cell_fails_and_says_which_row_and_a_folder_without_the_papers_systems_has_nothing(tmp_path):
    folder = _paper_tables(tmp_path)
    from voicebias.io import read_table

    t = read_table(folder / "describe_misgender.csv")
    write_table(folder / "describe_misgender.csv", t[~((t["system"] == "kimi_audio") & (t["lang"] == "es"))])
    bad = [g for g in check_published(folder) if not g["ok"]]
    assert [g["says"] for g in bad] == ["Kimi-Audio: zero misaligned errors in Spanish"]
    assert "has no row" in bad[0]["why"] and bad[0]["value"] is None
    # the reference systems of the embedded default are none of the paper's: nothing is compared
    other = tmp_path / "reference"
    other.mkdir()
    write_table(other / "describe_odds_ratios.csv", pd.DataFrame({"system": ["mixed"], "lang": ["ALL"], "n": [176]}))
    assert check_published(other) == []
