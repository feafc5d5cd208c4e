"""Repeats in the runner (run.samples_per_item): k seeded answers per item, sample 0 the answer of a run
without repeats, one row per item x sample in (item, sample) order."""

import numpy as np
import pandas as pd
import pytest

from voicebias.systems.base import S2SRequest, S2SResponse, S2SSystem, item_seed, sample_seed
from voicebias.systems.runner import ResponseCache, build_requests, cache_key, run_task, validate_responses
from voicebias.tasks import load_tasks
from voicebias.validation import ValidationFailed


class SeedEcho(S2SSystem):
    """Test double: the answer is a word drawn from a stream seeded by (request seed, stimulus), as
    the reference systems draw theirs; it records every seed it was called with."""

    def __init__(self):
        super().__init__("echo", {"adapter": "test", "output_voice": {}, "licence": "test"}, {"x": 1})
        self.seeds = []

    def respond(self, request):
        self.seeds.append((request.stimulus_id, request.sample, request.seed))
        rng = np.random.default_rng(item_seed(request.seed, request.stimulus_id))
        word = "female" if rng.random() < 0.5 else "male"
        return S2SResponse(
            status="ok",
            transcript=word,
            audio=np.full(1600, 0.1 + 0.01 * request.sample, np.float32),
            sample_rate=16000,
        )


def stimuli(tmp_path, n=4):
    rows = []
    for i in range(n):
        path = tmp_path / f"s{i}.flac"
        path.write_bytes(b"x")
        rows.append(
            {
                "stimulus_id": f"en-feminine-0{i}-male",
                "passage_id": f"en-feminine-0{i}",
                "lang": "en",
                "pole": "feminine",
                "voice_gender": "male",
                "voice_id": "v",
                "path": path.name,
                "sha256": f"{i:064d}",
            }
        )
    return pd.DataFrame(rows)[::-1]  # out of order on purpose: the table is sorted by stimulus id


TASK = load_tasks()["describe"]


def test_one_sample_is_the_run_without_the_setting(tmp_path):
    stim = stimuli(tmp_path)
    before, c0 = run_task(
        SeedEcho(), TASK, stim, tmp_path / "a", ResponseCache(tmp_path / "c0"), 5, tmp_path, progress=False
    )
    after, c1 = run_task(
        SeedEcho(), TASK, stim, tmp_path / "b", ResponseCache(tmp_path / "c1"), 5, tmp_path, progress=False, samples=1
    )
    assert "sample" not in after.columns
    assert before.drop(columns="output_audio").equals(after.drop(columns="output_audio"))
    assert [p.removeprefix("a/") for p in before["output_audio"]] == [
        p.removeprefix("b/") for p in after["output_audio"]
    ]
    # the keys of requests made as before repeats existed: the base seed, no sample index
    plain = [
        S2SRequest(s.stimulus_id, s.lang, "en", "describe", TASK.prompt("en"), str(tmp_path / s.path), s.sha256, 5)
        for s in stim.sort_values("stimulus_id").itertuples()
    ]
    assert list(after["cache_key"]) == [cache_key(SeedEcho(), r) for r in plain]
    _, reqs = build_requests(SeedEcho(), TASK, stim, 5, tmp_path, samples=1)
    assert reqs == plain


def test_three_samples_per_item(tmp_path):
    stim = stimuli(tmp_path)
    cache = ResponseCache(tmp_path / "cache")
    one, _ = run_task(SeedEcho(), TASK, stim, tmp_path / "k1", cache, 5, tmp_path, progress=False)
    system = SeedEcho()
    table, counts = run_task(system, TASK, stim, tmp_path / "k3", cache, 5, tmp_path, progress=False, samples=3)
    validate_responses(table)
    ids = sorted(stim["stimulus_id"])
    # one row per item x sample, in (item, sample) order, the sample column after stimulus_id
    assert list(zip(table["stimulus_id"], table["sample"])) == [(i, s) for i in ids for s in range(3)]
    cols = list(table.columns)
    assert cols[cols.index("stimulus_id") + 1] == "sample"
    # sample 0 is the run without repeats: same key, same answer, same file name (a cache hit: only 2 new
    # calls per item)
    s0 = table[table["sample"] == 0].drop(columns="sample").reset_index(drop=True)
    assert list(s0["cache_key"]) == list(one["cache_key"]) and list(s0["transcript"]) == list(one["transcript"])
    assert [p.split("/")[-1] for p in s0["output_audio"]] == [p.split("/")[-1] for p in one["output_audio"]]
    assert counts["calls"] == 2 * len(ids) and counts["cache_hits"] == len(ids)
    # every sample has its own seed from (base seed, item, sample), its own key and its own output file
    assert sorted(system.seeds) == sorted((i, s, sample_seed(5, i, s)) for i in ids for s in (1, 2))
    assert table["cache_key"].is_unique and table["output_audio"].is_unique
    assert all((tmp_path / p).is_file() for p in table["output_audio"])
    assert {p.split("/")[-1] for p in table.loc[table["sample"] == 2, "output_audio"]} == {
        f"{i}.sample2.flac" for i in ids
    }
    # resumed: every sample is a cache hit, the table is the same
    again, c2 = run_task(SeedEcho(), TASK, stim, tmp_path / "k3b", cache, 5, tmp_path, progress=False, samples=3)
    assert c2["calls"] == 0 and c2["cache_hits"] == 3 * len(ids)
    assert again.drop(columns="output_audio").equals(table.drop(columns="output_audio"))


def test_samples_draw_different_answers_from_a_seeded_system(tmp_path):
    """A planted reference system draws its answer from (request seed, system, stimulus, task):
    each sample is a fresh draw, sample 0 the answer of the run without repeats."""
    from voicebias.systems.reference import ReferenceSystem

    stim = stimuli(tmp_path, n=1)
    passages = pd.DataFrame({"passage_id": stim["passage_id"], "text": ["x"], "gloss_en": ["x"]})
    card = {"adapter": "reference", "output_voice": {"en": "en-us"}, "licence": "test"}
    ref = ReferenceSystem(
        "probe",
        card,
        {"rule": "content", "error_rate": 0.4, "noncompliance_rate": 0.0, "neutral_p_female": 0.5, "drift_st": 0.0},
        stimuli=stim,
        passages=passages,
    )
    _, single = build_requests(ref, TASK, stim, 3, tmp_path)
    _, many = build_requests(ref, TASK, stim, 3, tmp_path, samples=40)
    answers = [ref.answer_text(r) for r in many]
    assert answers[0] == ref.answer_text(single[0])
    share = answers.count("female") / len(answers)
    assert 0.3 < share < 0.95 and len(set(answers)) == 2  # P(female) = 1 - 0.4 for feminine content


def test_sample_seed():
    assert sample_seed(11, "a", 0) == 11
    seeds = [sample_seed(11, "a", s) for s in range(1, 50)]
    assert len(set(seeds)) == 49 and 11 not in seeds
    assert sample_seed(11, "a", 3) == sample_seed(11, "a", 3) != sample_seed(11, "b", 3) != sample_seed(12, "a", 3)
    assert all(0 <= s < 2**32 for s in seeds)
    with pytest.raises(ValueError, match="sample must be an integer >= 0"):
        sample_seed(11, "a", -1)


@pytest.mark.parametrize(
    "bad, message", [(0, "at least 1"), (-3, "at least 1"), (2.0, "whole number"), (True, "whole number")]
)
def test_bad_sample_counts_are_refused(tmp_path, bad, message):
    with pytest.raises(ValueError, match=message):
        run_task(
            SeedEcho(),
            TASK,
            stimuli(tmp_path),
            tmp_path / "o",
            ResponseCache(tmp_path / "c"),
            1,
            tmp_path,
            progress=False,
            samples=bad,
        )


def test_params_refuse_fewer_than_one_sample():
    import yaml

    from voicebias import config
    from voicebias.params import ParamsError, samples_per_item, validate_params

    raw = yaml.safe_load((config.ROOT / "profiles" / "embedded.yaml").read_text(encoding="utf-8"))
    assert validate_params(raw)["run"]["samples_per_item"] == 1
    raw["run"]["samples_per_item"] = 0
    with pytest.raises(
        ParamsError,
        match=r"run\.samples_per_item: must be at least 1: the number of answers drawn "
        r"per item \(1 = one answer, no repeats\) \(got 0\)",
    ):
        validate_params(raw)
    raw["run"]["samples_per_item"] = "3"
    with pytest.raises(ParamsError, match=r"run\.samples_per_item: expected a whole number"):
        validate_params(raw)
    # a hand-made mapping without the key reads the schema's default
    assert samples_per_item({"run": {"systems": ["a"]}}) == 1
    assert samples_per_item({"run": {"systems": ["a"], "samples_per_item": 4}}) == 4


def test_responses_gate_with_repeats(tmp_path):
    table, _ = run_task(
        SeedEcho(),
        TASK,
        stimuli(tmp_path),
        tmp_path / "o",
        ResponseCache(tmp_path / "c"),
        1,
        tmp_path,
        progress=False,
        samples=2,
    )
    validate_responses(table)
    dup = table.copy()
    dup.loc[1, "sample"] = 0  # two rows of one item x sample
    with pytest.raises(ValidationFailed, match="stimulus_id"):
        validate_responses(dup)
    # without a sample column a stimulus may appear once only
    one_per_item = table.drop(columns="sample").iloc[::2]
    validate_responses(one_per_item)
    with pytest.raises(ValidationFailed, match="stimulus_id"):
        validate_responses(pd.concat([one_per_item, one_per_item]))


# ---------------------------------------------------------------------------
# scoring carries the sample through


def test_text_scoring_scores_every_sample(tmp_path):
    from voicebias.scoring.text import score_responses

    table, _ = run_task(
        SeedEcho(),
        TASK,
        stimuli(tmp_path),
        tmp_path / "o",
        ResponseCache(tmp_path / "c"),
        5,
        tmp_path,
        progress=False,
        samples=3,
    )
    scored = score_responses(table)
    assert list(scored["sample"]) == list(table["sample"]) and list(scored.columns)[3] == "sample"
    assert list(scored["judged_gender"]) == list(table["transcript"])  # the echo says 'male' or 'female'


def test_acoustic_scoring_measures_every_sample(tmp_path):
    """Each sample's delta is its own output minus the common input; one row per item x sample."""
    from tests.fakes.stimuli import MALE_VOWEL_FORMANTS, synthetic_vowel
    from voicebias import config
    from voicebias.audio import write_audio
    from voicebias.instruments.composite import composite_measures, femininity_composite, reference_stats
    from voicebias.instruments.units import hz_to_semitones
    from voicebias.params import load_params
    from voicebias.scoring.acoustic import score_outputs

    params = load_params(config.ROOT / "profiles" / "embedded.yaml")
    params["acoustic_scoring"]["text_control"]["enabled"] = False
    f0 = {("p1-m", 0): 110.0, ("p1-m", 1): 220.0, ("p1-f", 0): 150.0, ("p1-f", 1): None}
    rows, inputs = [], []
    (tmp_path / "out").mkdir()
    for (sid, s), hz in f0.items():
        base = {
            "system": "s",
            "task": "readback",
            "stimulus_id": sid,
            "sample": s,
            "passage_id": "p1",
            "lang": "en",
            "target_lang": "en",
            "pole": "neutral",
            "voice_gender": "male" if sid.endswith("m") else "female",
            "transcript": "An answer.",
        }
        if hz is None:
            rows.append({**base, "status": "failed", "output_audio": "", "output_sha256": ""})
            continue
        rel = f"out/{sid}.sample{s}.wav"
        write_audio(tmp_path / rel, synthetic_vowel(hz, MALE_VOWEL_FORMANTS["a"], seconds=1.0, sr=16000), 16000)
        rows.append({**base, "status": "ok", "output_audio": rel, "output_sha256": f"sha-{sid}-{s}"})
    for i, (sid, hz) in enumerate((("p1-m", 110.0), ("p1-f", 120.0))):
        inputs.append(
            {
                "stimulus_id": sid,
                "lang": "en",
                "status": "ok",
                "f0_median_st": float(hz_to_semitones(hz)),
                "vtl_index": 0.01 * i,
                "margin_acoustic_norms": 0.5 * i - 1.0,
                "duration_s": 1.0,
                "voiced_fraction": 0.9,
            }
        )
    inputs = pd.DataFrame(inputs)
    names = composite_measures(params["acoustics"]["classifier"], params["acoustics"]["formant_term"])
    reference = reference_stats(inputs, names)
    inputs["composite"] = femininity_composite(inputs, reference, names)
    t = score_outputs(
        pd.DataFrame(rows[::-1]), inputs, reference, params, {"output_voice_gender": None}, tmp_path, tmp_path / "cache"
    )
    assert list(zip(t["stimulus_id"], t["sample"])) == [("p1-f", 0), ("p1-f", 1), ("p1-m", 0), ("p1-m", 1)]
    assert list(t.columns)[3] == "sample"
    d = t.set_index(["stimulus_id", "sample"])["delta_f0_median_st"]
    assert d[("p1-m", 0)] == pytest.approx(0.0, abs=0.2) and d[("p1-m", 1)] == pytest.approx(12.0, abs=0.2)
    assert d[("p1-f", 0)] == pytest.approx(12 * np.log2(150 / 120), abs=0.2)
    assert t.set_index(["stimulus_id", "sample"]).loc[("p1-f", 1), "status"] == "failed"
