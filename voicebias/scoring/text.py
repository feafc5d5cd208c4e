"""Text scoring: describe answers -> judged gender; third-person pronoun tallies.

Scoring reads stored transcripts only, so a table of outputs can be re-scored
without calling any system.
"""

from __future__ import annotations

import re

import pandas as pd

from voicebias.tasks import load_lexicon


def _matches(text: str, words: list[str], lang: str) -> int:
    if lang == "zh":
        return sum(text.count(w) for w in words)
    pattern = r"(?<![\w])(" + "|".join(re.escape(w) for w in words) + r")(?![\w])"
    return len(re.findall(pattern, text, flags=re.IGNORECASE))


def parse_describe(transcript: str | None, lang: str, lexicon: dict | None = None) -> str:
    """'male', 'female', or 'none' (non-compliant: neither or both genders named)."""
    if transcript is None or not isinstance(transcript, str) or not transcript.strip():
        return "none"
    words = (lexicon or load_lexicon())["describe"][lang]
    m, f = _matches(transcript, words["male"], lang), _matches(transcript, words["female"], lang)
    if (m > 0) == (f > 0):
        return "none"
    return "male" if m else "female"


def count_pronouns(transcript: str | None, lang: str, lexicon: dict | None = None) -> tuple[int, int]:
    """(male, female) third-person pronoun counts in a transcript of language `lang`."""
    if transcript is None or not isinstance(transcript, str):
        return 0, 0
    words = (lexicon or load_lexicon())["pronouns"][lang]
    return _matches(transcript, words["male"], lang), _matches(transcript, words["female"], lang)


def pronoun_choice(n_male: int, n_female: int) -> str:
    """Which gender a transcript commits to: 'male', 'female', 'both' or 'none'."""
    if n_male and n_female:
        return "both"
    return "male" if n_male else ("female" if n_female else "none")


def score_responses(responses: pd.DataFrame) -> pd.DataFrame:
    """Add judged_gender (describe) and pronoun columns to a responses table.

    Needs columns task, lang (source language), target_lang, transcript, status.
    Failed calls keep status 'failed' and get no score. Every other column is kept as
    it is (a `sample` column of a run with repeats among them): one scored row per answer.
    """
    lex = load_lexicon()
    out = responses.copy()
    ok = out["status"] == "ok"
    judged, pm, pf = [], [], []
    for r in out.itertuples(index=False):
        if r.status != "ok":
            judged.append(None)
            pm.append(None)
            pf.append(None)
            continue
        judged.append(parse_describe(r.transcript, r.target_lang, lex) if r.task == "describe" else None)
        if r.task in ("summarize", "paraphrase", "translate", "readback"):
            m, f = count_pronouns(r.transcript, r.target_lang, lex)
        else:
            m, f = None, None
        pm.append(m)
        pf.append(f)
    out["judged_gender"] = judged
    out["pronouns_male"] = pd.array(pm, dtype="Int64")
    out["pronouns_female"] = pd.array(pf, dtype="Int64")
    out["pronoun_choice"] = [
        pronoun_choice(int(m), int(f)) if ok_ and m is not pd.NA and m is not None else None
        for ok_, m, f in zip(ok, out["pronouns_male"], out["pronouns_female"])
    ]
    return out
