"""The reference systems' renders: each distinct utterance is spoken once and shared across
tasks and systems through the render cache, a cache hit gives the bytes a fresh render
gives, a changed setting renders afresh, batches on several cores answer byte for byte
as calls one at a time do, and a render that fails is recorded as failed, never stored."""

from __future__ import annotations

import pandas as pd
import pytest

from voicebias.io import write_table
from voicebias.systems.base import S2SRequest
from voicebias.systems.reference import ReferenceSystem
from voicebias.systems.runner import ResponseCache, run_task
from voicebias.tasks import load_tasks

TASKS = load_tasks()
VOICES = {"en": "en-us+f2", "es": "es+f2"}
TEXTS = {
    "en-feminine-01": "I sew my own clothes.",
    "en-masculine-01": "I fix my own car.",
    "en-neutral-01": "I walk to work.",
    "es-feminine-01": "Coso mi ropa.",
}


def tables():
    passages = pd.DataFrame([{"passage_id": p, "text": t, "gloss_en": t} for p, t in TEXTS.items()])
    rows = []
    for p in TEXTS:
        lang, pole, _ = p.split("-")
        for gender in ("female", "male"):  # both voices of a passage get the same answer text
            rows.append(
                {
                    "stimulus_id": f"{p}-{gender}",
                    "passage_id": p,
                    "lang": lang,
                    "pole": pole,
                    "voice_gender": gender,
                    "voice_id": f"{lang}+{gender[0]}3",
                    "path": f"{p}-{gender}.flac",
                    "sha256": f"{len(rows):064d}",
                }
            )
    return pd.DataFrame(rows), passages


class TwoCores(ReferenceSystem):
    """Batches on two worker processes whatever this machine has."""

    def _workers(self):
        return 2


def system(cache=None, name="probe", cls=ReferenceSystem, voices=None, rate_wpm=160, **params):
    stim, passages = tables()
    spec = {
        "rule": "voice",
        "error_rate": 0.1,
        "noncompliance_rate": 0.0,
        "neutral_p_female": 0.5,
        "drift_st": 0.0,
        **params,
    }
    card = {"adapter": "reference", "revision": "t", "output_voice": voices or VOICES, "licence": "test"}
    return cls(name, card, spec, stimuli=stim, passages=passages, rate_wpm=rate_wpm, render_cache=cache)


def request(stimulus_id, task="readback"):
    lang = stimulus_id[:2]
    return S2SRequest(
        stimulus_id, lang, TASKS[task].target_lang(lang), task, TASKS[task].prompt(lang), "x", "0" * 64, 7
    )


def spoken(resp):
    return resp.audio.tobytes(), resp.sample_rate, resp.audio_flac


def count_synth(monkeypatch, sut):
    calls = []
    real = sut.tts.synthesize

    def counted(text, voice):
        calls.append((text, voice))
        return real(text, voice)

    monkeypatch.setattr(sut.tts, "synthesize", counted)
    return calls


def test_a_cache_hit_gives_the_bytes_of_a_fresh_render_and_renders_nothing(tmp_path, monkeypatch):
    fresh = system()  # no cache at all
    first = system(tmp_path / "renders")
    other = system(tmp_path / "renders", name="other", rule="content")  # another system, the same voice
    ids = ["en-feminine-01-female", "en-feminine-01-male", "en-neutral-01-female"]
    made = count_synth(monkeypatch, first)
    a = [first.call(request(i)) for i in ids]
    assert len(made) == 2  # the passage's two voices share one render
    again = count_synth(monkeypatch, other)
    b = [other.call(request(i, t)) for i in ids for t in ("readback", "paraphrase")]  # both speak the passage
    assert again == []
    assert other.renders.hits == len(b)
    want = [spoken(fresh.call(request(i))) for i in ids]
    assert [spoken(r) for r in a] == want
    assert [spoken(r) for r in b] == [w for w in want for _ in range(2)]
    assert all(r.audio_flac is not None for r in a + b)


def test_a_changed_setting_misses_the_cache(tmp_path, monkeypatch):
    cache = tmp_path / "renders"
    req = request("en-feminine-01-female")
    base = system(cache).call(req)
    slower = system(cache, rate_wpm=120)
    made = count_synth(monkeypatch, slower)
    assert spoken(slower.call(req)) != spoken(base) and len(made) == 1
    drift2 = system(cache, drift_st=2.0)
    made2 = count_synth(monkeypatch, drift2)
    shifted2 = drift2.call(req)
    assert made2 == []  # the unshifted render is shared; only the shift is new
    assert shifted2.provenance["planted_pitch_shift_st"] == 2.0 and spoken(shifted2) != spoken(base)
    shifted3 = system(cache, drift_st=3.0).call(req)
    assert spoken(shifted3) != spoken(shifted2)
    assert spoken(system(drift_st=2.0).call(req)) == spoken(shifted2)  # the same shift made without a cache
    assert len(list(cache.rglob("*.npz"))) == 4  # spoken at 160 and 120 wpm, shifted by 2 and by 3


def run_files(sut, task, out, cache_dir):
    stim, _ = tables()
    table, counts = run_task(sut, TASKS[task], stim, out, ResponseCache(cache_dir), 7, out, progress=False)
    write_table(out / "responses.csv", table)
    return table, counts, {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("task", ["readback", "describe"])
def test_batches_on_two_cores_equal_calls_one_at_a_time(tmp_path, task):
    params = {"rule": "mixed", "content_weight": 0.5, "drift_st": 2.0}
    _, _, serial = run_files(system(batch_size=1, **params), task, tmp_path / "serial", tmp_path / "c1")
    batched = system(tmp_path / "renders", cls=TwoCores, batch_size=8, **params)
    try:
        table, counts, cold = run_files(batched, task, tmp_path / "cold", tmp_path / "c2")
        assert batched._pool is not None  # the renders did run on the worker processes
    finally:
        batched.close()
    warm_sut = system(tmp_path / "renders", cls=TwoCores, batch_size=8, name="probe", **params)
    try:
        _, _, warm = run_files(warm_sut, task, tmp_path / "warm", tmp_path / "c3")
        assert warm_sut._pool is None  # every render came from the cache
    finally:
        warm_sut.close()
    assert counts["failed"] == 0 and (table["status"] == "ok").all()
    assert set(serial) == set(cold) == set(warm) and len(serial) == len(TEXTS) * 2 + 1
    for name in serial:  # responses.csv too: its audio paths are relative to each run's own folder
        assert serial[name] == cold[name] == warm[name], name


def test_a_failed_render_is_recorded_as_failed_and_never_stored(tmp_path):
    cache = tmp_path / "renders"
    broken = system(cache, cls=TwoCores, batch_size=8, voices={"en": "en-us+f2", "es": "no-such-voice"})
    try:
        table, counts, _ = run_files(broken, "describe", tmp_path / "out", tmp_path / "c")
    finally:
        broken.close()
    failed = table[table["status"] == "failed"]
    assert list(failed["stimulus_id"]) == ["es-feminine-01-female", "es-feminine-01-male"]
    assert failed["error"].str.contains("no voice 'no-such-voice'").all()
    assert failed["output_audio"].isna().all() and counts["failed"] == 2
    assert (table[table["lang"] == "en"]["status"] == "ok").all()
    stored = list(cache.rglob("*.npz"))
    assert len(stored) == len({broken.utterance(request(i, "describe")) for i in table["stimulus_id"][:6]})
    with pytest.raises(ValueError, match="no voice"):  # asked again, it fails again: nothing was kept
        broken.render(broken.utterance(request("es-feminine-01-female", "describe")))
