"""Several voices per gender: which voices read, in what rotation, and what params accept."""

import copy

import pandas as pd
import pytest

from voicebias.cli.profiles import resolve_profile
from voicebias.errors import ConfigError
from voicebias.params import validate_params
from voicebias.stimuli.passages import assign_voices, voices_in_use


def bank(n_per_pole=10, langs=("en", "es")):
    return pd.DataFrame(
        [
            {"passage_id": f"{lang}-{pole}-{i:02d}", "lang": lang, "pole": pole}
            for lang in langs
            for pole in ("feminine", "masculine", "neutral")  # not in pole order: the rotation sorts
            for i in range(n_per_pole)
        ]
    )


def tts(n=None, k=6):
    voices = {
        lang: {"male": [f"{lang}+m{i}" for i in range(k)], "female": [f"{lang}+f{i}" for i in range(k)]}
        for lang in ("en", "es")
    }
    return {"voices": voices, "voices_per_gender": n}


@pytest.mark.parametrize("n, reads", [(1, 30), (3, 10), (6, 5)])
def test_each_voice_reads_an_equal_share_and_every_pole(n, reads):
    passages = bank()
    assigned = assign_voices(passages, tts(n))
    assert len(assigned) == 2 * len(passages)  # one voice per passage and gender
    table = pd.DataFrame(
        [(pid, g, v) for (pid, g), v in assigned.items()], columns=["passage_id", "voice_gender", "voice_id"]
    ).merge(passages, on="passage_id")
    for (lang, gender), g in table.groupby(["lang", "voice_gender"]):
        assert sorted(g["voice_id"].unique()) == sorted(tts(n)["voices"][lang][gender][:n])
        assert (g["voice_id"].value_counts() == reads).all()
        per_pole = g.groupby(["voice_id", "pole"]).size().unstack(fill_value=0)
        # 10 passages per pole over n voices: each voice reads floor or ceil of 10 / n of every pole
        assert per_pole.to_numpy().min() >= 10 // n and per_pole.to_numpy().max() <= -(-10 // n)
        assert all(v.startswith(f"{lang}+") for v in g["voice_id"])


def test_rotation_is_fixed_by_the_passages_not_by_their_row_order():
    passages = bank()
    shuffled = passages.sample(frac=1.0, random_state=1)
    assert assign_voices(passages, tts(3)) == assign_voices(shuffled, tts(3))


def test_voices_in_use_takes_the_first_n_and_refuses_too_few():
    assert voices_in_use(tts(2), "es", "female") == ["es+f0", "es+f1"]
    assert voices_in_use(tts(None), "en", "male") == [f"en+m{i}" for i in range(6)]
    assert voices_in_use({"voices": {"en": {"male": "one"}}}, "en", "male") == ["one"]
    with pytest.raises(ConfigError, match="voices_per_gender is 7, but tts.voices.en.male lists 6"):
        voices_in_use(tts(7), "en", "male")


def test_params_take_one_voice_or_a_list_and_refuse_too_few_or_repeats():
    raw = resolve_profile("embedded")
    one = copy.deepcopy(raw)
    one["tts"]["voices"]["en"] = {"male": "en-us+m3", "female": "en-us+f3"}
    one["tts"]["voices_per_gender"] = 1
    assert validate_params(one)["tts"]["voices"]["en"]["male"] == ["en-us+m3"]
    few = copy.deepcopy(raw)
    few["tts"]["voices_per_gender"] = 7
    with pytest.raises(Exception, match="voices_per_gender is 7, but tts.voices.en.male lists 6"):
        validate_params(few)
    twice = copy.deepcopy(raw)
    twice["tts"]["voices"]["es"]["female"] = ["es+f3", "es+f3", "es+Andrea"]
    with pytest.raises(Exception, match="names a voice more than once: es\\+f3"):
        validate_params(twice)


def test_profiles_set_the_number_of_voices():
    embedded = validate_params(resolve_profile("embedded"))
    many = validate_params(resolve_profile("many_voices"))
    paper = validate_params(resolve_profile("paper"))
    assert embedded["tts"]["voices_per_gender"] == 3 and many["tts"]["voices_per_gender"] == 6
    assert paper["tts"]["voices_per_gender"] == 3
    for p in (embedded, many, paper):
        n = p["tts"]["voices_per_gender"]
        for lang in ("en", "es", "zh"):
            for gender in ("male", "female"):
                assert len(set(voices_in_use(p["tts"], lang, gender))) == n >= 3
    # the many-voices profile changes the number of voices and nothing else
    assert {k: v for k, v in many.items() if k not in ("tts", "base")} == {
        k: v for k, v in embedded.items() if k not in ("tts", "base")
    }
