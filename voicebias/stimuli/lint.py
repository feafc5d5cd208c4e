"""Neutrality linters: no word of a passage may reveal the speaker's gender.

The S2S protocol needs passages whose content carries a stereotype while their words carry no
gender (S2S paper, sec. 3.2 and App. E). Each rule looks for one kind of cue in one language
(English, Spanish, Mandarin: gendered pronouns and nouns, kinship and spouse terms, Spanish
speaker agreement) or in any language (one theme per passage, one pole per theme) and returns the
offending words; `lint_text` and `lint_table` apply them. Rules are deliberately lexical and
explainable: a false alarm is fixed by rewording the passage, or by extending the rule's exception
list here, with a test.

The rules and examples of what each catches: docs/stimuli.md, "The neutrality linter".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable

import pandas as pd

_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)


@dataclass(frozen=True)
class Rule:
    """One neutrality rule: `find(text)` returns the offending words (empty when clean)."""

    name: str
    lang: str
    description: str
    find: Callable[[str], list[str]]


def _regex_finder(pattern: str, flags: int = re.IGNORECASE) -> Callable[[str], list[str]]:
    rx = re.compile(pattern, flags)

    def find(text: str) -> list[str]:
        return [m.group(0) for m in rx.finditer(text or "")]

    return find


def _words(words: Iterable[str]) -> str:
    return "|".join(sorted((re.escape(w) for w in words), key=len, reverse=True))


# ---------------------------------------------------------------- English
EN_PRONOUNS = ["he", "she", "him", "her", "his", "hers", "himself", "herself"]
EN_NOUNS = [
    "man",
    "men",
    "woman",
    "women",
    "boy",
    "boys",
    "girl",
    "girls",
    "guy",
    "guys",
    "gal",
    "gals",
    "lady",
    "ladies",
    "gentleman",
    "gentlemen",
    "sir",
    "madam",
    "ma'am",
    "lad",
    "lads",
    "lass",
    "lassie",
    "dude",
    "bloke",
    "king",
    "queen",
    "prince",
    "princess",
    "bride",
    "bridegroom",
    "widow",
    "widower",
    "actress",
    "waitress",
    "hostess",
    "stewardess",
    "seamstress",
    "heroine",
    "maid",
    "maiden",
    "male",
    "males",
    "female",
    "females",
    "masculine",
    "feminine",
    "manly",
    "womanly",
    "boyish",
    "girlish",
    "tomboy",
    "housewife",
    "househusband",
    "ladylike",
]
# words ending in -man/-men that are not gendered nouns
EN_MAN_EXCEPTIONS = {
    "human",
    "german",
    "roman",
    "talisman",
    "shaman",
    "caiman",
    "cayman",
    "ottoman",
    "doberman",
    "ramen",
    "amen",
    "omen",
    "specimen",
    "abdomen",
    "regimen",
    "acumen",
    "stamen",
    "semen",
    "hymen",
    "lumen",
    "yemen",
    "dolmen",
    "carmen",
    "rumen",
    "germen",
    "hetman",
    "oman",
}
# titles only when capitalised ("ms" is also milliseconds)
_EN_TITLE_RX = re.compile(r"\b(?:Mr|Mrs|Ms|Mx)\b\.?")
EN_KIN = [
    "husband",
    "husbands",
    "wife",
    "wives",
    "boyfriend",
    "boyfriends",
    "girlfriend",
    "girlfriends",
    "fiance",
    "fiancé",
    "fiancee",
    "fiancée",
    "hubby",
    "missus",
    "mother",
    "mothers",
    "father",
    "fathers",
    "mom",
    "moms",
    "mum",
    "mums",
    "mommy",
    "mummy",
    "dad",
    "dads",
    "daddy",
    "son",
    "sons",
    "daughter",
    "daughters",
    "brother",
    "brothers",
    "sister",
    "sisters",
    "aunt",
    "aunts",
    "auntie",
    "uncle",
    "uncles",
    "niece",
    "nieces",
    "nephew",
    "nephews",
    "grandmother",
    "grandmothers",
    "grandfather",
    "grandfathers",
    "grandma",
    "grandpa",
    "granny",
    "grandson",
    "grandsons",
    "granddaughter",
    "granddaughters",
    "stepmother",
    "stepfather",
    "stepson",
    "stepdaughter",
    "stepbrother",
    "stepsister",
    "godmother",
    "godfather",
]
_EN_NOUN_RX = re.compile(rf"(?<![\w'’-])(?:{_words(EN_NOUNS)})(?![\w'’-])|\b[a-z]+(?:wo)?m[ae]n\b", re.IGNORECASE)


def _en_gendered_nouns(text: str) -> list[str]:
    hits = [m.group(0) for m in _EN_TITLE_RX.finditer(text or "") if not m.group(0).startswith("Mx")]
    for m in _EN_NOUN_RX.finditer(text or ""):
        w = m.group(0)
        if w.lower() in EN_MAN_EXCEPTIONS:
            continue
        hits.append(w)
    return hits


# ---------------------------------------------------------------- Spanish
ES_PRONOUNS = ["él", "ella", "ellas", "nosotras", "vosotras"]
ES_NOUNS = [
    "hombre",
    "hombres",
    "mujer",
    "mujeres",
    "chico",
    "chica",
    "chicas",
    "señor",
    "señora",
    "señoras",
    "señorita",
    "muchacho",
    "muchacha",
    "muchachas",
    "caballero",
    "caballeros",
    "dama",
    "damas",
    "niño",
    "niña",
    "niñas",
    "varón",
    "varones",
    "femenino",
    "femenina",
    "masculino",
    "masculina",
    "chaval",
    "chavala",
]
ES_KIN = [
    "marido",
    "esposo",
    "esposa",
    "esposas",
    "novio",
    "novia",
    "novias",
    "prometido",
    "prometida",
    "madre",
    "madres",
    "padre",
    "mamá",
    "papá",
    "hijo",
    "hija",
    "hijas",
    "hermano",
    "hermana",
    "hermanas",
    "abuelo",
    "abuela",
    "abuelas",
    "tío",
    "tía",
    "tías",
    "sobrino",
    "sobrina",
    "sobrinas",
    "suegro",
    "suegra",
    "yerno",
    "nuera",
    "cuñado",
    "cuñada",
    "viudo",
    "viuda",
]
# Copular and change-of-state frames: any -o/-a word right after them (past adverbs)
# agrees with the speaker ("estoy lista", "me quedé helado").
ES_COPULAR_FRAMES = [
    "estoy",
    "estuve",
    "estaré",
    "he estado",
    "soy",
    "fui",
    "seré",
    "he sido",
    "me siento",
    "me sentía",
    "me sentí",
    "me sentiré",
    "me quedo",
    "me quedaba",
    "me quedé",
    "quedo",
    "quedé",
    "me pongo",
    "me puse",
    "me ponía",
    "me veo",
    "me vi",
    "me veía",
    "me noto",
    "me noté",
    "me encuentro",
    "me encontré",
    "me considero",
    "me creo",
    "me vuelvo",
    "me volví",
    "resulto",
    "resulté",
    "parezco",
    "me mantengo",
    "me mantuve",
    "permanezco",
    # forms shared with the third person count only with an explicit "yo"
    "yo era",
    "yo estaba",
    "yo sería",
    "yo estaría",
    "yo quedaba",
    "yo parecía",
    "yo había estado",
]
# Depictive frames: only participles and state adjectives agree ("llego agotada"),
# while other -o/-a words are usually adverbs or objects ("vuelvo temprano").
ES_DEPICTIVE_FRAMES = [
    "llego",
    "llegué",
    "salgo",
    "salí",
    "vuelvo",
    "volví",
    "terminé",
    "acabo",
    "acabé",
    "sigo",
    "seguí",
    "ando",
    "anduve",
    "duermo",
    "dormí",
    "me levanto",
    "me levanté",
    "me acuesto",
    "me acosté",
    "me despierto",
    "me desperté",
    "regresé",
    "entro",
    "entré",
    "yo",
]
ES_PLURAL_FRAMES = [
    "estamos",
    "estábamos",
    "estuvimos",
    "somos",
    "éramos",
    "fuimos",
    "nos sentimos",
    "nos quedamos",
    "quedamos",
    "nos pusimos",
    "nos vemos",
    "llegamos",
    "salimos",
    "volvimos",
    "terminamos",
    "acabamos",
]
ES_SKIP = {
    "muy",
    "tan",
    "bastante",
    "un",
    "poco",
    "algo",
    "super",
    "súper",
    "más",
    "menos",
    "totalmente",
    "completamente",
    "realmente",
    "demasiado",
    "medio",
    "casi",
    "ya",
    "todavía",
    "aún",
    "siempre",
    "nunca",
    "también",
    "bien",
    "re",
    "verdaderamente",
    "absolutamente",
    "francamente",
    "tremendamente",
    "increíblemente",
    "sumamente",
    "no",
    "tampoco",
    "mucho",
    "muchísimo",
    "otra",
    "vez",
}
# -o/-a words after a frame that do not agree with the speaker
ES_NOT_AGREEING = {
    "a",
    "la",
    "lo",
    "una",
    "uno",
    "toda",
    "todo",
    "otra",
    "otro",
    "cada",
    "nada",
    "algo",
    "esta",
    "esto",
    "esa",
    "eso",
    "aquella",
    "aquello",
    "mi",
    "mía",
    "mío",
    "tu",
    "su",
    "nuestra",
    "nuestro",
    "vuestra",
    "vuestro",
    "cuya",
    "cuyo",
    "misma",
    "mismo",
    "para",
    "hasta",
    "contra",
    "hacia",
    "sobre",
    "durante",
    "pronto",
    "temprano",
    "tanto",
    "tanta",
    "mucho",
    "mucha",
    "poco",
    "poca",
    "demasiado",
    "medio",
    "casa",
    "ahora",
    "afuera",
    "fuera",
    "encima",
    "abajo",
    "arriba",
    "adentro",
    "dentro",
    "cerca",
    "luego",
    "apenas",
    "persona",
    "electricista",
    "pediatra",
    "atleta",
    "policía",
    "guía",
    "recepcionista",
    "dentista",
    "florista",
    "estilista",
    "periodista",
    "artista",
    "taxista",
    "camionista",
    "maquinista",
    "oficinista",
    "turista",
    "especialista",
    "nada",
    "claro",
    "quizá",
    "como",
    "donde",
    "cuando",
    "porque",
    "pero",
    "ocho",
    "cinco",
    "cuatro",
    "cuarto",
    "media",
    "hora",
    "horas",
    "obra",
    "rato",
    "día",
    "mañana",
    "semana",
    "agua",
    "comida",
    "receta",
    "ruta",
    "camino",
    "tarea",
    "parte",
    "trabajo",
    "sólo",
}
ES_STATE_ADJ = {
    "contento",
    "contenta",
    "solo",
    "sola",
    "tranquilo",
    "tranquila",
    "listo",
    "lista",
    "satisfecho",
    "satisfecha",
    "orgulloso",
    "orgullosa",
    "nervioso",
    "nerviosa",
    "despierto",
    "despierta",
    "muerto",
    "muerta",
    "exhausto",
    "exhausta",
    "rendido",
    "rendida",
    "feliz",
    "seguro",
    "segura",
    "mojado",
    "mojada",
    "empapado",
    "empapada",
    "sucio",
    "sucia",
    "limpio",
    "limpia",
    "lleno",
    "llena",
    "hambriento",
    "hambrienta",
    "vivo",
    "viva",
    "quieto",
    "quieta",
    "atento",
    "atenta",
    "harto",
    "harta",
    "ansioso",
    "ansiosa",
    "dispuesto",
    "dispuesta",
    "encantado",
    "encantada",
    "preocupado",
    "preocupada",
    "ocupado",
    "ocupada",
    "sediento",
    "sedienta",
    "afónico",
    "afónica",
    "molido",
    "molida",
    "roto",
    "rota",
    "hecho",
    "hecha",
    "puesto",
    "puesta",
    "suelto",
    "suelta",
    "descalzo",
    "descalza",
}
_PARTICIPLE = re.compile(r"(?:ad|id|íd)[oa]s?$|(?:ch|rt|st|bt|lt|ct)[oa]s?$")
_ADJ_SUFFIX = re.compile(r"(?:os|iv|ic|ient|ánt|ent)[oa]s?$")


_ONLY_FOLLOWERS = {"un", "una", "el", "la", "los", "las", "unos", "unas", "para", "por", "que", "lo"}


def _es_tokens(text: str) -> list[str]:
    return [t.lower() for t in _WORD.findall(text or "")]


def _frames(frames: list[str]) -> list[tuple[str, ...]]:
    return sorted((tuple(f.split()) for f in frames), key=len, reverse=True)


_ES_COP, _ES_DEP, _ES_PL = _frames(ES_COPULAR_FRAMES), _frames(ES_DEPICTIVE_FRAMES), _frames(ES_PLURAL_FRAMES)


def _es_agreeing(word: str, kind: str) -> bool:
    if word in ES_NOT_AGREEING and not (kind == "depictive" and word in ES_STATE_ADJ):
        return False
    if word.endswith(("ando", "iendo", "yendo")):  # gerunds do not agree
        return False
    if kind == "plural":
        return word.endswith(("os", "as")) and len(word) > 3
    if not word.endswith(("o", "a")) or len(word) < 3:
        return False
    if kind == "copular":
        return True
    return word in ES_STATE_ADJ or bool(_PARTICIPLE.search(word)) or bool(_ADJ_SUFFIX.search(word))


def _es_speaker_agreement(text: str) -> list[str]:
    toks = _es_tokens(text)
    hits: list[str] = []
    i = 0
    while i < len(toks):
        matched = None
        for kind, frames in (("copular", _ES_COP), ("depictive", _ES_DEP), ("plural", _ES_PL)):
            for f in frames:
                if tuple(toks[i : i + len(f)]) == f:
                    matched = (kind, f)
                    break
            if matched:
                break
        if not matched:
            i += 1
            continue
        kind, f = matched
        j = i + len(f)
        while j < len(toks) and toks[j] in ES_SKIP and j - (i + len(f)) < 3:
            j += 1
        if j < len(toks):
            w = toks[j]
            if f == ("yo",):
                if w in ("mismo", "misma", "solo", "sola"):
                    hits.append(f"yo {w}")
            elif w == "solo" and j + 1 < len(toks) and toks[j + 1] in _ONLY_FOLLOWERS:
                pass  # adverbial 'solo' = 'only' ("soy solo un aprendiz")
            elif _es_agreeing(w, kind):
                hits.append(f"{' '.join(f)} … {w}" if j > i + len(f) else f"{' '.join(f)} {w}")
        i += len(f)
    # "por mí misma", "a mí mismo": reflexive intensifier agrees with the speaker
    hits += [m.group(0) for m in re.finditer(r"\bm[ií]\s+mism[oa]\b", text or "", re.IGNORECASE)]
    return hits


_ES_SPEAKER_NOUN = re.compile(
    r"\b(?:soy|fui|seré|he\s+sido|yo\s+era|me\s+convertí\s+en|me\s+considero|"
    r"trabajo\s+como|trabajé\s+como|trabajaba\s+como|hago\s+de|hice\s+de)\s+"
    r"(?:un|una|el|la|otro|otra)\b(?!\s+(?:poco|poquito|persona|vez)\b)",
    re.IGNORECASE,
)


def _es_speaker_noun(text: str) -> list[str]:
    return [m.group(0) for m in _ES_SPEAKER_NOUN.finditer(text or "")]


# ---------------------------------------------------------------- Mandarin
ZH_PRONOUNS = r"他|她"
ZH_KIN = [
    "丈夫",
    "妻子",
    "老公",
    "老婆",
    "太太",
    "媳妇",
    "男朋友",
    "女朋友",
    "男友",
    "女友",
    "未婚夫",
    "未婚妻",
    "妈妈",
    "爸爸",
    "母亲",
    "父亲",
    "妈",
    "爸",
    "儿子",
    "女儿",
    "哥哥",
    "姐姐",
    "弟弟",
    "妹妹",
    "爷爷",
    "奶奶",
    "外公",
    "外婆",
    "姥姥",
    "姥爷",
    "叔叔",
    "伯伯",
    "舅舅",
    "姑姑",
    "阿姨",
    "婶婶",
    "公公",
    "婆婆",
    "岳父",
    "岳母",
    "女婿",
    "儿媳",
    "孙子",
    "孙女",
    "侄子",
    "侄女",
    "外甥",
    "外甥女",
]
ZH_NOUNS = [
    "先生",
    "小姐",
    "女士",
    "姑娘",
    "小伙子",
    "小伙",
    "大叔",
    "大妈",
    "大爷",
    "帅哥",
    "美女",
    "妇女",
    "少妇",
    "老太太",
    "老头",
    "丫头",
    "闺女",
    "爷们",
    "娘们",
    "汉子",
]
_ZH_KIN_RX = re.compile(_words(ZH_KIN))
_ZH_NOUN_RX = re.compile(_words(ZH_NOUNS) + r"|[男女][\u4e00-\u9fff]?")


def _zh_gendered_nouns(text: str) -> list[str]:
    # kinship words are their own rule; mask them so one cue is reported once
    masked = _ZH_KIN_RX.sub(lambda m: "　" * len(m.group(0)), text or "")
    return [m.group(0) for m in _ZH_NOUN_RX.finditer(masked)]


RULES: list[Rule] = [
    Rule(
        "en_gendered_pronoun",
        "en",
        "third-person gendered pronoun",
        _regex_finder(rf"(?<![\w'’-])(?:{_words(EN_PRONOUNS)})(?![\w-])"),
    ),
    Rule("en_gendered_noun", "en", "gendered noun or adjective for a person", _en_gendered_nouns),
    Rule(
        "en_kinship_spouse",
        "en",
        "gendered kinship or spouse term",
        _regex_finder(rf"(?<![\w'’-])(?:{_words(EN_KIN)})(?![\w'’])"),
    ),
    Rule(
        "es_third_person_pronoun",
        "es",
        "gendered pronoun (él, ella, nosotras, ...)",
        _regex_finder(rf"(?<!\w)(?:{_words(ES_PRONOUNS)})(?!\w)"),
    ),
    Rule(
        "es_speaker_agreement",
        "es",
        "adjective or participle agreeing with the speaker in a first-person frame",
        _es_speaker_agreement,
    ),
    Rule("es_speaker_noun", "es", "determiner or noun phrase naming the speaker's gender", _es_speaker_noun),
    Rule(
        "es_gendered_noun", "es", "gendered noun for a person", _regex_finder(rf"(?<!\w)(?:{_words(ES_NOUNS)})(?!\w)")
    ),
    Rule(
        "es_kinship_spouse",
        "es",
        "gendered kinship or spouse term",
        _regex_finder(rf"(?<!\w)(?:{_words(ES_KIN)})(?!\w)"),
    ),
    Rule("zh_third_person_pronoun", "zh", "他 or 她", _regex_finder(ZH_PRONOUNS, 0)),
    Rule("zh_gendered_noun", "zh", "男/女 word or gendered person noun (also for oneself)", _zh_gendered_nouns),
    Rule("zh_kinship_spouse", "zh", "gendered kinship or spouse term", _regex_finder(_ZH_KIN_RX.pattern, 0)),
]
RULES_BY_NAME = {r.name: r for r in RULES}
STRUCTURE_RULES = ("theme_single", "theme_pole")
# The English gloss (reference for the translate task) is linted with the English rules.
GLOSS_RULES = [r for r in RULES if r.lang == "en"]


def gloss_rule_name(rule: Rule) -> str:
    return f"gloss_{rule.name}"


def rule_columns(languages: Iterable[str]) -> list[str]:
    """Names of the lint columns `lint_table` adds for these languages."""
    langs = set(languages)
    cols = [r.name for r in RULES if r.lang in langs]
    cols += [gloss_rule_name(r) for r in GLOSS_RULES]
    return cols + list(STRUCTURE_RULES)


def lint_text(text: str, lang: str) -> dict[str, list[str]]:
    """Rule name -> offending words, for every rule of `lang` that fires on `text`."""
    out = {}
    for r in RULES:
        if r.lang == lang:
            hits = r.find(text)
            if hits:
                out[r.name] = hits
    return out


_THEME_SEPARATORS = re.compile(r"[;|/\n]|,\s|\band\s+(?:also|then)\b|\bplus\b")


def _theme_problem(theme) -> str | None:
    if theme is None or (isinstance(theme, float) and pd.isna(theme)):
        return "no theme"
    if not isinstance(theme, str):
        return f"theme is a {type(theme).__name__}, not one string"
    if not theme.strip():
        return "empty theme"
    if _THEME_SEPARATORS.search(theme):
        return f"several themes: '{theme}'"
    return None


def lint_table(df: pd.DataFrame, languages: Iterable[str] | None = None) -> pd.DataFrame:
    """Add one column per rule: None where the passage is clean, else 'passage_id: word, word'.

    Columns missing from `df` (a broken table) leave their rules empty, so the
    schema expectations, not this function, report them.
    """
    langs = list(languages) if languages is not None else sorted(set(df.get("lang", pd.Series(dtype=str)).dropna()))
    out = df.copy()
    ids = (
        out["passage_id"].astype(str)
        if "passage_id" in out
        else pd.Series([str(i) for i in out.index], index=out.index)
    )

    def col(values: list) -> pd.Series:
        # object dtype keeps None as None (a str dtype would turn it into NaN)
        return pd.Series(values, index=out.index, dtype=object)

    def fmt(pid: str, hits: list[str]) -> str | None:
        return f"{pid}: {', '.join(dict.fromkeys(hits))}" if hits else None

    for r in RULES:
        if r.lang not in langs:
            continue
        if "text" in out and "lang" in out:
            out[r.name] = col(
                [
                    fmt(pid, r.find(t)) if lang == r.lang and isinstance(t, str) else None
                    for pid, t, lang in zip(ids, out["text"], out["lang"])
                ]
            )
        else:
            out[r.name] = None
    for r in GLOSS_RULES:
        name = gloss_rule_name(r)
        if "gloss_en" in out:
            out[name] = col(
                [fmt(pid, r.find(g)) if isinstance(g, str) else None for pid, g in zip(ids, out["gloss_en"])]
            )
        else:
            out[name] = None
    if "theme" in out:
        out["theme_single"] = col(
            [(f"{pid}: {p}" if (p := _theme_problem(t)) else None) for pid, t in zip(ids, out["theme"])]
        )
    else:
        out["theme_single"] = None
    if {"theme", "pole"} <= set(out.columns):
        poles = out.dropna(subset=["theme"]).groupby(out["theme"].astype(str))["pole"].agg(lambda s: sorted(set(s)))
        out["theme_pole"] = col(
            [
                (
                    f"{pid}: theme '{t}' is {'/'.join(poles[str(t)])} across languages"
                    if isinstance(t, str) and len(poles.get(t, [])) > 1
                    else None
                )
                for pid, t in zip(ids, out["theme"])
            ]
        )
    else:
        out["theme_pole"] = None
    return out


def lint_hits(df: pd.DataFrame, languages: Iterable[str] | None = None) -> pd.DataFrame:
    """Tidy list of every hit: passage_id, lang, rule, words (empty table when all pass)."""
    langs = list(languages) if languages is not None else sorted(set(df["lang"].dropna()))
    table = lint_table(df, langs)
    rows = []
    for col in rule_columns(langs):
        for pid, lang, v in zip(table["passage_id"], table["lang"], table[col]):
            if isinstance(v, str):
                rows.append({"passage_id": pid, "lang": lang, "rule": col, "words": v.split(": ", 1)[1]})
    return pd.DataFrame(rows, columns=["passage_id", "lang", "rule", "words"])


def lint_expectations(languages: Iterable[str]) -> list:
    """One Great Expectations check per rule: its column must be empty on every row."""
    from voicebias.validation import expectations

    E = expectations()
    return [E.ExpectColumnValuesToBeNull(column=col) for col in rule_columns(languages)]
