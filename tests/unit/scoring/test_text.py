"""Describe parsing and pronoun tallies with the per-language lexica."""

import pandas as pd
import pytest

from voicebias.scoring.text import count_pronouns, parse_describe, score_responses


@pytest.mark.parametrize(
    "text,lang,expected",
    [
        ("female", "en", "female"),
        ("Male.", "en", "male"),
        ("A woman.", "en", "female"),
        ("The speaker sounds like a man", "en", "male"),
        ("male or female, hard to say", "en", "none"),  # both genders named: non-compliant
        ("I cannot tell.", "en", "none"),
        ("", "en", "none"),
        (None, "en", "none"),
        ("Mujer", "es", "female"),
        ("hombre", "es", "male"),
        ("女", "zh", "female"),
        ("男性", "zh", "male"),
        ("男女都有可能", "zh", "none"),
    ],
)
def test_parse_describe(text, lang, expected):
    assert parse_describe(text, lang) == expected


def test_female_is_not_counted_as_male():
    # 'female' contains 'male' and 'woman' contains 'man': whole-word matching only
    assert parse_describe("female woman", "en") == "female"


def test_pronoun_counts():
    assert count_pronouns("She said her shift was long; he agreed.", "en") == (1, 2)
    assert count_pronouns("Ella habló de su trabajo.", "es") == (0, 1)
    assert count_pronouns("el taller de él", "es") == (1, 0)  # the article 'el' is not a pronoun
    assert count_pronouns("他说她来了", "zh") == (1, 1)


def test_score_responses_keeps_failures_unscored():
    df = pd.DataFrame(
        [
            {"task": "describe", "lang": "en", "target_lang": "en", "transcript": "female", "status": "ok"},
            {"task": "describe", "lang": "en", "target_lang": "en", "transcript": None, "status": "failed"},
            {
                "task": "summarize",
                "lang": "es",
                "target_lang": "es",
                "transcript": "Él habló del taller.",
                "status": "ok",
            },
            {"task": "translate", "lang": "zh", "target_lang": "en", "transcript": "I fix engines.", "status": "ok"},
        ]
    )
    s = score_responses(df)
    assert s.loc[0, "judged_gender"] == "female"
    assert s["judged_gender"].iloc[1:].isna().all()
    assert s.loc[2, "pronoun_choice"] == "male"
    assert s.loc[3, "pronoun_choice"] == "none"
    assert s.loc[1, "status"] == "failed" and pd.isna(s.loc[1, "pronoun_choice"])
