"""The reply screen: each kind of unusable reply gets its own reason, a usable reply passes,
and the refusal phrases never match a passage of the bank (a readback must not be mistaken
for a refusal)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from voicebias.config import ROOT
from voicebias.contract import FAULTS, REPLY_REASONS
from voicebias.systems.base import S2SResponse, S2SSystem
from voicebias.systems.reference import FAULT_REASONS, REFUSALS, faulty_audio
from voicebias.systems.runner import ResponseCache, run_task, validate_responses
from voicebias.systems.screen import (
    ReplyLimits,
    ReplyScreen,
    audio_facts,
    file_facts,
    is_refusal,
    limits_from_params,
    screen_reply,
)
from voicebias.tasks import load_lexicon, load_tasks

SR = 16000
LIMITS = ReplyLimits(
    min_duration_s=0.05,
    max_duration_s=600.0,
    max_reply_ratio=4.0,
    min_sample_rate=11000,
    silence_dbfs=-60.0,
    max_clipped_fraction=0.001,
)


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


@pytest.mark.parametrize(
    "lang,text",
    [
        ("en", "I\u2019m sorry, but I can\u2019t help with that request."),
        ("en", "I'm sorry, but I can't assist with that."),
        ("es", "Lo siento, no puedo ayudar con esa solicitud."),
        ("zh", "抱歉，我无法帮助处理这个请求。"),
    ],
)
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


# --- the screen inside the runner: each fault becomes an excluded row with its reason ---


class FaultySystem(S2SSystem):
    """Test double: the reply to stimulus i carries FAULTS[i] (the last stimulus: a well-formed
    reply), made by the reference system's own fault maker; counts its calls."""

    def __init__(self):
        super().__init__("faulty", {"adapter": "test", "output_voice": {}, "licence": "test"}, {"x": 1})
        self.calls = 0

    def respond(self, request):
        self.calls += 1
        i = int(request.stimulus_id.split("-")[2])
        x = speech_like(1.5)
        if i == len(FAULTS):
            return S2SResponse(status="ok", transcript="female", audio=x, sample_rate=SR)
        fault = FAULTS[i]
        text = REFUSALS["en"] if fault == "refusal" else "female"
        audio, sr = (x, SR) if fault == "refusal" else faulty_audio(fault, x, SR, np.random.default_rng(i))
        return S2SResponse(status="ok", transcript=text, audio=audio, sample_rate=sr if audio is not None else None)


def fault_stimuli(tmp_path):
    rows = []
    for i in range(len(FAULTS) + 1):
        (tmp_path / f"s{i}.flac").write_bytes(b"x")
        rows.append(
            {
                "stimulus_id": f"en-feminine-{i:02d}-male",
                "passage_id": f"en-feminine-{i:02d}",
                "lang": "en",
                "pole": "feminine",
                "voice_gender": "male",
                "voice_id": "v",
                "path": f"s{i}.flac",
                "sha256": f"{i:064d}",
                "duration_s": 2.0,
            }
        )
    return pd.DataFrame(rows)


def test_the_runner_excludes_each_faulty_reply_with_its_reason_and_never_asks_again(tmp_path):
    task = load_tasks()["describe"]
    cache = ResponseCache(tmp_path / "cache")
    system, stim = FaultySystem(), fault_stimuli(tmp_path)
    table, counts = run_task(system, task, stim, tmp_path / "out", cache, 1, tmp_path, progress=False)
    validate_responses(table)
    by_id = table.set_index("stimulus_id")
    expected = {FAULTS[i]: FAULT_REASONS[FAULTS[i]] for i in range(len(FAULTS))}
    expected["noise"] = None  # noise is speech-shaped for the screen: the acoustic measurement excludes it
    for i, fault in enumerate(FAULTS):
        row = by_id.loc[f"en-feminine-{i:02d}-male"]
        if expected[fault] is None:
            assert row["status"] == "ok" and pd.isna(row["reason"]), fault
        else:
            assert (row["status"], row["reason"]) == ("excluded", expected[fault]), fault
            assert isinstance(row["error"], str) and row["error"], fault
        # the reply's audio stays beside its row wherever it has samples, so it can be heard
        assert pd.isna(row["output_audio"]) == (fault in ("no_audio", "empty_audio")), fault
    good = by_id.loc[f"en-feminine-{len(FAULTS):02d}-male"]
    assert good["status"] == "ok" and pd.isna(good["reason"])
    assert counts["excluded"] == len(FAULTS) - 1 and counts["failed"] == 0
    # an excluded reply is a reply: cached as it came and not asked again
    again, c2 = run_task(system, task, stim, tmp_path / "out2", cache, 1, tmp_path, progress=False)
    assert system.calls == len(FAULTS) + 1 and c2["calls"] == 0 and c2["cache_hits"] == len(FAULTS) + 1
    assert again.drop(columns=["output_audio"]).equals(table.drop(columns=["output_audio"]))
    # the limits are applied when the table is built: a looser clipping limit re-screens the cached reply
    loose = ReplyScreen(ReplyLimits(max_clipped_fraction=1.0))
    relaxed, c3 = run_task(system, task, stim, tmp_path / "out3", cache, 1, tmp_path, progress=False, screen=loose)
    row = relaxed.set_index("stimulus_id").loc[f"en-feminine-{FAULTS.index('clipping'):02d}-male"]
    assert row["status"] == "ok" and c3["calls"] == 0


def test_the_screen_limits_follow_the_acoustics_params():
    from voicebias.params import load_params

    lim = limits_from_params(load_params())
    # Praat's pitch window (3 periods of the 60 Hz floor) plus two 10 ms steps; twice the 5500 Hz ceiling
    assert lim.min_duration_s == pytest.approx(3 / 60 + 2 * 0.01) and lim.min_sample_rate == 11000
    assert (lim.silence_dbfs, lim.max_clipped_fraction, lim.max_duration_s, lim.max_reply_ratio) == (-60, 0.001, 600, 4)


def test_cached_reply_facts_are_each_files_facts_and_identical_bytes_are_decoded_once(tmp_path, monkeypatch):
    """The runner reads each cached reply's facts and SHA-256 once per distinct content (the same
    answer from several tasks), on every core; each path gets its own file's facts, damaged ones included."""
    import hashlib

    import soundfile as sf

    from voicebias.systems import runner

    a, b = tmp_path / "a.flac", tmp_path / "b.flac"
    sf.write(a, speech_like(1.0), SR, format="FLAC", subtype="PCM_16")
    sf.write(b, 0.5 * speech_like(0.5, f0=120.0), SR, format="FLAC", subtype="PCM_16")
    same = tmp_path / "a_again.flac"
    same.write_bytes(a.read_bytes())
    broken = tmp_path / "broken.flac"
    broken.write_bytes(b"fLaC" + bytes(64))
    decoded = []
    monkeypatch.setattr(runner, "file_facts", lambda p: decoded.append(p) or file_facts(p))
    paths = [a, b, same, broken, a]
    got = runner._cached_audio_facts(paths)
    assert set(got) == {str(p) for p in paths}
    assert len(decoded) == 3  # a (or its copy), b, broken
    for p in paths:
        digest, facts = got[str(p)]
        assert digest == hashlib.sha256(p.read_bytes()).hexdigest()
        assert facts == file_facts(str(p))
    assert got[str(a)][1]["frames"] == SR and got[str(b)][1]["frames"] == SR // 2
    assert "undecodable" in got[str(broken)][1]
