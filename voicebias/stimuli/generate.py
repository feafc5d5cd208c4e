"""Extending the passage bank with an LLM writer and an LLM judge panel (S2S paper, sec. 3.2).

    seeds -> candidates (writer LLM) -> neutrality lint -> panel ratings (judge LLMs)
          -> top `per_cell` per language x pole, one passage per theme

Every judge rates each lint-clean candidate's gender coding (1-7), pole, naturalness and any
speaker-gender cue; a candidate is kept when the panel's majority pole is its target, no judge saw
a cue and naturalness reaches `min_naturalness`. LLM backends (voicebias.clients.chat): openai,
gemini, transformers; every reply is cached under .cache/llm, so a re-run is free and reproduces
the same files.

The rating scale, the intensity formula and the outputs: docs/stimuli.md, "Extending the passage bank".
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from tqdm import tqdm

from voicebias.clients.chat import CachedChat
from voicebias.clients.llm import parse_json_reply
from voicebias.contract import POLES
from voicebias.stimuli.bank import length_units, load_bank
from voicebias.stimuli.lint import GLOSS_RULES, lint_text

LANG_NAMES = {"en": "English", "es": "Spanish (Spain)", "zh": "Mandarin Chinese (simplified characters)"}
UNIT_NAMES = {"en": "words", "es": "words", "zh": "Chinese characters"}
CANDIDATE_COLUMNS = [
    "candidate_id",
    "lang",
    "pole",
    "theme",
    "seed_term",
    "seed_source",
    "seed_statistic",
    "sample",
    "writer",
    "status",
    "lint_hits",
    "length_units",
    "text",
    "gloss_en",
]
RATING_COLUMNS = [
    "candidate_id",
    "judge",
    "model",
    "status",
    "gender_coding",
    "pole",
    "naturalness",
    "speaker_gender_cue",
    "reason",
]
SELECTION_COLUMNS = [
    "passage_id",
    "candidate_id",
    "lang",
    "pole",
    "theme",
    "intensity",
    "mean_coding",
    "mean_naturalness",
    "n_judges",
    "pole_agreement",
]


# ------------------------------------------------------------------ prompts and parsing


def writer_messages(seed: dict[str, Any], lang: str, window: list[int]) -> list[dict[str, str]]:
    lo, hi = window
    target = (lo + hi) // 2
    agreement = (
        "In Spanish, never use an adjective, participle, determiner or noun whose gender agrees with "
        "the speaker (no 'cansado/cansada', 'soy la encargada', 'yo mismo'); rephrase with invariable "
        "forms or verbs instead. "
        if lang == "es"
        else ""
    )
    system = (
        "You write short first-person passages for a speech study. The passage is spoken by one person about "
        "their own day or work. It must not reveal the speaker's gender in any word: no he/she or other "
        "third-person gendered pronoun, no gendered noun (man, woman, girl, mother, husband, ...), no name, "
        f"no gendered title. {agreement}Write natural, idiomatic {LANG_NAMES[lang]}. Keep to one theme. "
        f"Length: {lo}-{hi} {UNIT_NAMES[lang]} (aim for about {target}). "
        'Answer with JSON only: {"text": "<the passage>", "gloss_en": "<a faithful English translation>"}.'
    )
    stereotype = {
        "masculine": "an activity or occupation stereotypically associated with men",
        "feminine": "an activity or occupation stereotypically associated with women",
        "neutral": "an everyday activity with no gender association",
    }[seed["pole"]]
    user = (
        f"Theme: {seed['theme']}\nSeed: {seed.get('seed_term') or seed['theme']}\n"
        f"The theme is {stereotype}; let the concrete details of the activity carry that association, "
        "never any word about the speaker."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


JUDGE_SYSTEM = (
    "You rate short first-person passages for a study of gender stereotypes in speech technology. Judge only "
    "the content: what activities, objects and settings the passage describes. Answer with JSON only: "
    '{"gender_coding": <integer 1-7: 1 = content strongly stereotyped as feminine, 4 = no gender association, '
    '7 = strongly stereotyped as masculine>, "pole": "feminine" | "neutral" | "masculine", '
    '"naturalness": <integer 1-5: how natural and idiomatic the passage reads>, '
    '"speaker_gender_cue": <true if any word reveals the speaker\'s own gender, else false>, '
    '"reason": "<one short sentence>"}'
)


def judge_messages(text: str, lang: str) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": JUDGE_SYSTEM},
        {"role": "user", "content": f"Language: {LANG_NAMES[lang]}\nPassage:\n{text}"},
    ]


def parse_rating(reply: str) -> dict[str, Any]:
    """A validated rating, or {'status': 'invalid: <why>'}."""
    obj = parse_json_reply(reply)
    if obj is None:
        return {"status": "invalid: no JSON object"}
    try:
        coding = float(obj["gender_coding"])
        natural = float(obj["naturalness"])
        pole = str(obj["pole"]).strip().lower()
        cue = obj["speaker_gender_cue"]
    except (KeyError, TypeError, ValueError) as exc:
        return {"status": f"invalid: {exc.__class__.__name__} {exc}"}
    if not (1 <= coding <= 7 and 1 <= natural <= 5) or pole not in POLES or not isinstance(cue, bool):
        return {"status": "invalid: value out of range"}
    return {
        "status": "ok",
        "gender_coding": coding,
        "pole": pole,
        "naturalness": natural,
        "speaker_gender_cue": cue,
        "reason": str(obj.get("reason", ""))[:300],
    }


def intensity(pole: str, mean_coding: float) -> float:
    """Stereotype intensity toward `pole` from a mean 1-7 coding (1 = fully on-pole)."""
    if pole == "masculine":
        return (mean_coding - 4.0) / 3.0
    if pole == "feminine":
        return (4.0 - mean_coding) / 3.0
    return 1.0 - abs(mean_coding - 4.0) / 3.0


# ------------------------------------------------------------------ the stage


def load_seeds(bank_dir: Path, languages: list[str], extra: Path | None = None) -> pd.DataFrame:
    """Themes with their provenance: the shipped bank's, plus an optional YAML list of
    {pole, theme, seed_term, seed_source, seed_statistic} used for every language."""
    bank = load_bank(bank_dir, languages)
    cols = ["lang", "pole", "theme", "seed_term", "seed_source", "seed_statistic"]
    seeds = bank[cols].drop_duplicates(["lang", "theme"])
    if extra:
        entries = yaml.safe_load(Path(extra).read_text(encoding="utf-8")) or []
        if not isinstance(entries, list):
            raise ValueError(f"{extra}: expected a list of seeds")
        rows = []
        for e in entries:
            if e.get("pole") not in POLES or not e.get("theme"):
                raise ValueError(f"{extra}: every seed needs a pole ({'/'.join(POLES)}) and a theme: {e}")
            if e["pole"] != "neutral" and not (e.get("seed_source") and e.get("seed_statistic")):
                raise ValueError(f"{extra}: stereotyped seed '{e['theme']}' needs seed_source and seed_statistic")
            rows += [{"lang": lang, **{c: e.get(c) for c in cols[1:]}} for lang in languages]
        seeds = pd.concat([seeds, pd.DataFrame(rows, columns=cols)]).drop_duplicates(["lang", "theme"])
    return seeds.sort_values(["lang", "pole", "theme"]).reset_index(drop=True)


def _candidate_id(lang: str, theme: str, sample: int) -> str:
    return "cand-" + hashlib.sha1(f"{lang}\n{theme}\n{sample}".encode()).hexdigest()[:12]


def generate_candidates(
    seeds: pd.DataFrame, writer: CachedChat, cfg: dict[str, Any], windows: dict[str, list[int]], base_seed: int
) -> pd.DataFrame:
    rows = []
    n = int(cfg["candidates_per_seed"])
    temp = float(cfg["writer"]["temperature"] if cfg["writer"]["temperature"] is not None else 0.9)
    jobs = [(s, k) for s in seeds.to_dict("records") for k in range(n)]
    for s, k in tqdm(jobs, desc="writing candidates"):
        lang = s["lang"]
        reply = writer.complete(
            writer_messages(s, lang, windows[lang]), temp, int(cfg["max_tokens"]), seed=base_seed + k
        )
        obj = parse_json_reply(reply) or {}
        text = str(obj.get("text") or "").strip()
        gloss = str(obj.get("gloss_en") or "").strip() or (text if lang == "en" else "")
        row = {
            **s,
            "candidate_id": _candidate_id(lang, s["theme"], k),
            "sample": k,
            "writer": writer.backend.describe(),
            "text": text,
            "gloss_en": gloss,
        }
        if not text:
            row.update(status="unparsable", lint_hits="", length_units=0, text=reply.strip()[:2000])
        else:
            hits = lint_text(text, lang)
            hits.update({f"gloss_{r.name}": f for r in GLOSS_RULES if (f := r.find(gloss))})
            units = length_units(text, lang)
            lo, hi = windows[lang]
            if not lo <= units <= hi:
                hits["length_window"] = [f"{units} {UNIT_NAMES[lang]} outside {lo}-{hi}"]
            row.update(
                status="lint_failed" if hits else "lint_passed",
                length_units=units,
                lint_hits="; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(hits.items())),
            )
        rows.append(row)
    return pd.DataFrame(rows, columns=CANDIDATE_COLUMNS)


def rate_candidates(cands: pd.DataFrame, judges: list[tuple[str, CachedChat]], cfg: dict[str, Any]) -> pd.DataFrame:
    rows = []
    todo = cands[cands["status"] == "lint_passed"]
    jobs = [(c, name, j) for c in todo.itertuples(index=False) for name, j in judges]
    for c, name, judge in tqdm(jobs, desc="panel ratings"):
        reply = judge.complete(judge_messages(c.text, c.lang), 0.0, int(cfg["judge_max_tokens"]), seed=0)
        r = parse_rating(reply)
        rows.append({"candidate_id": c.candidate_id, "judge": name, "model": judge.backend.describe(), **r})
    return pd.DataFrame(rows, columns=RATING_COLUMNS)


def select_passages(cands: pd.DataFrame, ratings: pd.DataFrame, cfg: dict[str, Any], n_judges: int) -> pd.DataFrame:
    """Panel summary per candidate and the top `per_cell` per language x pole over distinct themes."""
    ok = ratings[ratings["status"] == "ok"].merge(
        cands[["candidate_id", "pole"]].rename(columns={"pole": "target"}), on="candidate_id"
    )
    if ok.empty:
        return pd.DataFrame(columns=SELECTION_COLUMNS)
    ok = ok.assign(agrees=(ok["pole"] == ok["target"]).astype(float), cue=ok["speaker_gender_cue"].astype(bool))
    agg = (
        ok.groupby("candidate_id")
        .agg(
            mean_coding=("gender_coding", "mean"),
            mean_naturalness=("naturalness", "mean"),
            n_judges=("judge", "nunique"),
            any_cue=("cue", "any"),
            pole_agreement=("agrees", "mean"),
        )
        .reset_index()
    )
    df = cands.merge(agg, on="candidate_id")
    df["intensity"] = [round(intensity(p, c), 4) for p, c in zip(df["pole"], df["mean_coding"])]
    min_judges = int(cfg["min_judges"] or math.ceil(n_judges / 2))
    keep = (
        (df["n_judges"] >= min_judges)
        & (df["pole_agreement"] > 0.5)
        & ~df["any_cue"]
        & (df["mean_naturalness"] >= float(cfg["min_naturalness"]))
    )
    df = df[keep].sort_values(
        ["lang", "pole", "intensity", "mean_naturalness", "candidate_id"], ascending=[True, True, False, False, True]
    )
    df = df.drop_duplicates(["lang", "theme"])  # best candidate per theme
    top = df.groupby(["lang", "pole"], sort=False).head(int(cfg["per_cell"])).copy()
    top["passage_id"] = [
        f"{lang}-{p}-g{i:02d}"
        for (lang, p), grp in top.groupby(["lang", "pole"], sort=False)
        for i in range(1, len(grp) + 1)
    ]
    return top[SELECTION_COLUMNS].reset_index(drop=True)


def selection_yaml(selection: pd.DataFrame, cands: pd.DataFrame, panel: str) -> dict[str, str]:
    """Bank-format YAML per language for the selected passages (to screen, then move into data/bank)."""
    full = selection.merge(cands.drop(columns=["lang", "pole", "theme"]), on="candidate_id")
    out = {}
    for lang, grp in full.groupby("lang"):
        entries = [
            {
                "passage_id": r.passage_id,
                "lang": r.lang,
                "pole": r.pole,
                "theme": r.theme,
                "seed_term": r.seed_term,
                "seed_source": r.seed_source,
                "seed_statistic": None if pd.isna(r.seed_statistic) else r.seed_statistic,
                "statistic_checked": False,
                "text": r.text,
                "gloss_en": r.gloss_en,
                "intensity": float(r.intensity),
                "rated_by": panel,
                "review_status": "unreviewed",
                "generated_by": r.writer,
                "candidate_id": r.candidate_id,
            }
            for r in grp.itertuples(index=False)
        ]
        out[str(lang)] = yaml.safe_dump(entries, allow_unicode=True, sort_keys=False, width=100)
    return out
