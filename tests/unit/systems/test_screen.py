"""The reply screen: each kind of unusable reply gets its own reason, a usable reply passes,
and the refusal phrases never match a passage of the bank (a readback must not be mistaken
for a refusal)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from voicebias.config import ROOT
from voicebias.contract import FAULTS, REPLY_REASONS
from voicebias.systems.reference import FAULT_REASONS, faulty_audio
from voicebias.systems.screen import ReplyLimits, audio_facts, file_facts, is_refusal, screen_reply
from voicebias.tasks import load_lexicon

SR = 16000
LIMITS = ReplyLimits(min_duration_s=0.05, max_duration_s=600.0, max_reply_ratio=4.0, min_sample_rate=11000,
                     silence_dbfs=-60.0, max_clipped_fraction=0.001)


def speech_like(seconds=2.0, sr=SR, f0=180.0):
    t = np.arange(int(seconds * sr)) / sr
    x = sum(np.sin(2 * np.pi * k * f0 * t) / k for k in range(1, 8)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return (0.05 * x).astype(np.float32)


def test_a_usable_reply_passes():
    assert screen_reply(audio_facts(speech_like(), SR), "I walk to work.", [], LIMITS, input_duration_s=2.0) is None


@pytest.mark.parametrize("fault", [f for f in FAULTS if FAULT_REASONS[f] != "no_voicing" and f != "refusal"])
def test_each_planted_fault_gets_its_own_reason(fault):
    audio, sr = faulty_audio(fault, speech_like(), SR, np.random.default_rng(0))
    got = screen_reply(audio_facts(audio, sr), "I walk to work.", [], LIMITS, input_duration_s=2.0)
    assert got is not None and got[0] == FAULT_REASONS[fault], got
    assert got[0] in REPLY_REASONS and got[1]


def test_noise_passes_the_screen_and_is_left_to_the_measurement():
    """White noise at speech level is neither silent, clipped nor short: whether it holds voiced
    speech is the acoustic measurement's question (reason no_voicing there)."""
    audio, sr = faulty_audio("noise", speech_like(), SR, np.random.default_rng(0))
    assert screen_reply(audio_facts(audio, sr), "I walk to work.", [], LIMITS, input_duration_s=2.0) is None
    assert abs(float(np.std(audio)) - float(np.std(speech_like()))) < 0.01


def test_length_limits_are_closed_at_the_threshold():
    x = speech_like(seconds=0.05)
    assert screen_reply(audio_facts(x, SR), "a", [], LIMITS) is None  # exactly 50 ms is long enough
    assert screen_reply(audio_facts(x[:-1], SR), "a", [], LIMITS)[0] == "too_short"
    long = audio_facts(speech_like(seconds=8.0), SR)
    assert screen_reply(long, "a", [], LIMITS, input_duration_s=2.0) is None  # 4 times: allowed
    assert screen_reply(long, "a", [], LIMITS, input_duration_s=1.99)[0] == "too_long"
    assert screen_reply(long, "a", [], ReplyLimits(max_reply_ratio=None), input_duration_s=0.1) is None


def test_undecodable_and_non_finite_audio(tmp_path):
    bad = tmp_path / "x.flac"
    bad.write_bytes(b"fLaC" + b"\x00" * 40)
    facts = file_facts(str(bad))
    assert screen_reply(facts, "a", [], LIMITS)[0] == "not_audio"
    x = speech_like()
    x[10] = np.nan
    assert screen_reply(audio_facts(x, SR), "a", [], LIMITS)[0] == "nan"


def test_file_facts_equal_the_facts_of_the_samples(tmp_path):
    from voicebias.audio import read_audio, write_audio

    path = tmp_path / "r.flac"
    write_audio(path, speech_like(), SR)
    x, sr = read_audio(path)
    assert file_facts(str(path)) == audio_facts(x, sr)


@pytest.mark.parametrize("lang,text", [
    ("en", "I\u2019m sorry, but I can\u2019t help with that request."),
    ("en", "I'm sorry, but I can't assist with that."),
    ("es", "Lo siento, no puedo ayudar con esa solicitud."),
    ("zh", "抱歉，我无法帮助处理这个请求。"),
])
def test_refusals_are_recognised_in_each_language(lang, text):
    refusals = load_lexicon()["refusal"][lang]
    got = screen_reply(audio_facts(speech_like(), SR), text, refusals, LIMITS)
    assert got[0] == "refusal"


def test_the_reference_refusals_are_recognised():
    from voicebias.systems.reference import NONCOMPLIANT, REFUSALS

    lex = load_lexicon()["refusal"]
    for lang, text in REFUSALS.items():
        assert is_refusal(text, lex[lang]), lang
    for lang, text in NONCOMPLIANT.items():  # a non-committal describe answer is not a refusal
        assert is_refusal(text, lex[lang]) is None, lang


def test_no_passage_of_the_bank_reads_as_a_refusal():
    """A readback speaks the passage: were a passage to contain a refusal phrase, every readback
    of it would be excluded. The bank's first-person passages, and their English glosses, never do."""
    lex = load_lexicon()["refusal"]
    checked = 0
    for lang in ("en", "es", "zh"):
        for entry in yaml.safe_load((ROOT / "data" / "bank" / f"{lang}.yaml").read_text(encoding="utf-8")):
            assert is_refusal(entry["text"], lex[lang]) is None, entry["passage_id"]
            if entry.get("gloss_en"):
                assert is_refusal(entry["gloss_en"], lex["en"]) is None
            checked += 1
    assert checked == 90
