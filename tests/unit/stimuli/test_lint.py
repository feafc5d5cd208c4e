"""Neutrality linters: each planted gender cue is caught by the rule meant for it,
and ordinary first-person wording that reveals nothing is left alone."""

import pandas as pd
import pytest

from voicebias import config
from voicebias.params import load_params
from voicebias.stimuli.bank import load_bank, validate_passages
from voicebias.stimuli.lint import RULES, lint_hits, lint_text, rule_columns
from voicebias.validation import ValidationFailed

WINDOW = load_params(config.ROOT / "profiles" / "embedded.yaml")["bank"]["length_window"]

# (language, rule meant to catch it, sentence with exactly one kind of cue)
PLANTED = [
    ("en", "en_gendered_pronoun", "After the shift my supervisor said she was proud of the crew."),
    ("en", "en_gendered_pronoun", "I handed the wrench back to him before lunch."),
    ("en", "en_gendered_noun", "As the only woman on the crew, I carry the heaviest coil."),
    ("en", "en_gendered_noun", "The foreman waved me over to the scaffold."),
    ("en", "en_gendered_noun", "I have worked as a waitress since college."),
    ("en", "en_gendered_noun", "Every morning Mrs. Alvarez hands me the keys."),
    ("en", "en_kinship_spouse", "My husband packs my lunch before I leave for the site."),
    ("en", "en_kinship_spouse", "Being a mother of two, I plan every minute of the morning."),
    ("es", "es_third_person_pronoun", "Mi jefa dice que ella nunca llega tarde."),
    ("es", "es_third_person_pronoun", "Nosotras terminamos el turno a las ocho."),
    ("es", "es_speaker_agreement", "Al final del turno estoy agotada y me voy a casa."),
    ("es", "es_speaker_agreement", "Me siento muy orgulloso del trabajo que hicimos."),
    ("es", "es_speaker_agreement", "Cuando vi el resultado quedé encantada."),
    ("es", "es_speaker_agreement", "Soy nueva en el taller."),
    ("es", "es_speaker_agreement", "Llegué empapado a la oficina."),
    ("es", "es_speaker_agreement", "Lo monté yo misma en una tarde."),
    ("es", "es_speaker_agreement", "Los domingos estoy solo en el taller."),
    ("es", "es_speaker_agreement", "Estoy seguro de que el cable aguanta."),
    ("es", "es_speaker_agreement", "Desde hace años soy psicóloga infantil."),
    ("es", "es_speaker_agreement", "Al acabar la obra estamos cansadas pero felices."),
    ("es", "es_speaker_noun", "En esta obra soy la encargada de la cuadrilla."),
    ("es", "es_speaker_noun", "Trabajo como una más del equipo de montaje."),
    ("es", "es_gendered_noun", "Como cualquier hombre del oficio, reviso el cuadro dos veces."),
    ("es", "es_gendered_noun", "La señora del segundo piso me trae café."),
    ("es", "es_kinship_spouse", "Mi marido me espera con la cena lista."),
    ("es", "es_kinship_spouse", "Después del trabajo recojo a mi hija en el colegio."),
    ("zh", "zh_third_person_pronoun", "下班后，师傅说她明天还要来检查。"),
    ("zh", "zh_third_person_pronoun", "我把扳手递给他，然后继续干活。"),
    ("zh", "zh_gendered_noun", "作为队里唯一的女生，我每天最早到工地。"),
    ("zh", "zh_gendered_noun", "我是一个普通的男人，每天开车上班。"),
    ("zh", "zh_gendered_noun", "顾客都叫我小姐，我就笑着答应。"),
    ("zh", "zh_kinship_spouse", "我老公每天早上给我做饭。"),
    ("zh", "zh_kinship_spouse", "下班后我去幼儿园接女儿回家。"),
]

# First-person wording that reveals nothing: no rule may fire.
CLEAN = [
    ("en", "I miss the last bus, so I walk home through the human traffic of the market."),
    ("en", "I slurp a bowl of ramen and check the specimen labels again."),
    ("en", "I call my partner and my kids before the shift; my parents visit on Sunday."),
    ("es", "Me hice una sopa caliente y me puse la capucha."),
    ("es", "Vuelvo temprano, sigo la receta y me quedo toda la tarde en casa."),
    ("es", "La calle estaba mojada y la cocina era pequeña."),
    ("es", "Estoy trabajando desde las ocho; soy electricista y soy una persona paciente."),
    ("es", "Estoy bien, me siento útil y llegué a la obra a tiempo."),
    ("es", "Soy un poco impaciente y muy puntual."),
    ("es", "Soy solo un aprendiz; este tipo de cable y el trabajo de la tarde me cuestan."),
    ("en", "The relay answers in 200 ms and I note it in the log."),
    ("zh", "我们每天早上八点上班，我把工具放进车里。"),
    ("zh", "我和同事一起把屋顶的瓦片换好了。"),
]


@pytest.mark.parametrize("lang,rule,text", PLANTED, ids=[f"{r}-{i}" for i, (_, r, _t) in enumerate(PLANTED)])
def test_planted_cue_is_caught_by_its_rule(lang, rule, text):
    fired = lint_text(text, lang)
    assert rule in fired, f"{rule} missed: {text!r} (fired: {fired})"
    # the cue is reported by its own rule only, so the failure names the right problem
    assert set(fired) == {rule}, fired


@pytest.mark.parametrize("lang,text", CLEAN)
def test_neutral_wording_passes(lang, text):
    assert lint_text(text, lang) == {}


def test_every_language_rule_has_a_planted_case():
    covered = {rule for _, rule, _ in PLANTED}
    assert covered == {r.name for r in RULES}


@pytest.fixture(scope="module")
def bank():
    return load_bank(config.BANK_DIR)


def test_great_expectations_suite_names_each_failing_rule(bank):
    """One planted passage per rule, in copies of shipped passages: the GE suite fails
    and its summary names every rule with the passage it caught."""
    df = bank.copy()
    planted_ids = {}
    for lang, rule, text in PLANTED:
        if rule in planted_ids:
            continue
        free = df[(df["lang"] == lang) & ~df["passage_id"].isin(planted_ids.values())].index[0]
        df.loc[free, "text"] = df.loc[free, "text"] + " " + text
        planted_ids[rule] = df.loc[free, "passage_id"]
    with pytest.raises(ValidationFailed) as err:
        validate_passages(df, WINDOW)
    msg = str(err.value)
    for rule, pid in planted_ids.items():
        assert f"column '{rule}'" in msg and f"{pid}:" in msg, rule
    # and nothing else: the untouched rules (gloss, theme) still pass
    assert "gloss_en_" not in msg and "theme_" not in msg


def test_gloss_is_linted_with_english_rules(bank):
    df = bank.copy()
    i = df.index[df["passage_id"] == "zh-neutral-01"][0]
    df.loc[i, "gloss_en"] = df.loc[i, "gloss_en"] + " My sister waved from the platform."
    hits = lint_hits(df)
    assert list(hits["rule"]) == ["gloss_en_kinship_spouse"] and list(hits["passage_id"]) == ["zh-neutral-01"]


def test_one_theme_per_passage(bank):
    df = bank.copy()
    i = df.index[df["passage_id"] == "en-neutral-02"][0]
    df.loc[i, "theme"] = "cooking rice; doing laundry"
    with pytest.raises(ValidationFailed, match="theme_single"):
        validate_passages(df, WINDOW)


def test_theme_keeps_its_pole_across_languages(bank):
    df = bank.copy()
    i = df.index[df["passage_id"] == "es-masculine-01"][0]
    df.loc[i, ["pole", "passage_id"]] = ["feminine", "es-feminine-11"]
    hits = lint_hits(df)
    flagged = set(hits.loc[hits["rule"] == "theme_pole", "passage_id"])
    # every passage on 'wiring a new house' is flagged: en and zh say masculine, es now feminine
    assert flagged == {"en-masculine-01", "es-feminine-11", "zh-masculine-01"}


@pytest.mark.parametrize("lang,units", [("en", 120), ("es", 30), ("zh", 200)])
def test_length_window_per_language(bank, lang, units):
    df = bank.copy()
    i = df.index[df["lang"] == lang][0]
    df.loc[i, "length_units"] = units
    with pytest.raises(ValidationFailed) as err:
        validate_passages(df, WINDOW)
    assert "length_units" in str(err.value) and str(units) in str(err.value)


def test_rule_columns_follow_languages():
    assert not any(c.startswith("zh_") for c in rule_columns(["en", "es"]))
    assert "es_speaker_agreement" in rule_columns(["es"])
    assert pd.Series(rule_columns(["en", "es", "zh"])).is_unique
