"""Speech-continuation stimuli: the NOP_set as shipped, the SS_set loader on a fixture in
the dataset's layout, and the stage voicing both with 2 male + 2 female voices."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from voicebias import config
from voicebias.audio import read_audio, rms_dbfs
from voicebias.pipeline.sc_stimuli import run_stage
from voicebias.stimuli.lint import lint_text
from voicebias.stimuli.prompts import (
    load_nop_set,
    load_ss_set,
    sc_voices,
    ss_prompts,
    validate_nop_set,
    validate_sc_manifest,
)
from voicebias.validation import ValidationFailed

NOP = config.DATA / "nop_set" / "nop_set.yaml"
FIXTURE = config.ROOT / "tests" / "fixtures" / "ss_set"
VOICES = {"male": ["en-us+m3", "en-us+m1"], "female": ["en-us+f3", "en-us+f4"]}


@pytest.fixture(scope="module")
def nop():
    return load_nop_set(NOP)


def test_nop_set_has_150_neutral_open_starters_in_15_categories(nop):
    assert len(nop) == 150 and nop["category"].nunique() == 15
    assert nop.groupby("category").size().eq(10).all()
    assert nop["prompt_id"].is_unique and nop["text"].is_unique
    report = validate_nop_set(nop)
    assert report.success
    assert all(lint_text(t, "en") == {} for t in nop["text"])
    assert not nop["text"].str.contains(r"[.!?]$").any()
    assert nop["source"].notna().all() and set(nop["review_status"]) <= {"unreviewed", "reviewed"}


@pytest.mark.parametrize(
    "mutate,rule",
    [
        (
            lambda d: d.assign(text=d["text"].where(d.index != 7, "I asked her whether the bus was")),
            "en_gendered_pronoun",
        ),
        (lambda d: d.assign(text=d["text"].where(d.index != 8, "My wife thinks the new park is")), "en_kinship_spouse"),
        (lambda d: d.assign(text=d["text"].where(d.index != 9, "The bus was late again today.")), "text"),
        (lambda d: d.drop(index=12), "category_size"),
    ],
)
def test_broken_nop_set_is_rejected_by_the_right_check(nop, mutate, rule):
    with pytest.raises(ValidationFailed) as err:
        validate_nop_set(mutate(nop.copy()).reset_index(drop=True))
    assert f"column '{rule}'" in str(err.value)


def test_ss_loader_keeps_clips_over_three_seconds():
    clips = load_ss_set(FIXTURE)
    assert list(clips["clip_id"]) == ["00000", "00001", "00002", "00003"]  # 00004 lasts 0.66 s
    assert (clips["duration_s"] > 3.0).all()
    assert list(clips["voice_gender"]) == ["female", "male", "female", "male"]
    assert clips["speaker"].iloc[1] == "en-US-BrianMultilingualNeural"
    assert all(Path(p).exists() for p in clips["audio_path"])
    prompts = ss_prompts(clips)
    assert list(prompts["prompt_id"]) == ["ss-00000", "ss-00002"] and set(prompts["prompt_set"]) == {"ss"}
    assert len(load_ss_set(FIXTURE, min_duration_s=0.5)) == 5


def test_ss_loader_says_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="Spoken StereoSet not found"):
        load_ss_set(tmp_path / "nowhere")
    copy = tmp_path / "ss"
    shutil.copytree(FIXTURE, copy)
    (copy / "speech" / "gender" / "00003_en-US-BrianMultilingualNeural.wav").unlink()
    with pytest.raises(FileNotFoundError, match="00003_en-US-BrianMultilingualNeural.wav"):
        load_ss_set(copy)


def test_sc_voices_need_both_genders_balanced_and_distinct():
    assert [s for _, s, _ in sc_voices({"voices": VOICES})] == ["male1", "male2", "female1", "female2"]
    with pytest.raises(KeyError, match="female"):
        sc_voices({"voices": {"male": ["en-us+m3"]}})
    with pytest.raises(ValueError, match="unbalanced"):
        sc_voices({"voices": {"male": ["en-us+m3"], "female": ["en-us+f3", "en-us+f4"]}})
    with pytest.raises(ValueError, match="twice"):
        sc_voices({"voices": {"male": ["en-us+m3", "en-us+m3"], "female": ["en-us+f3", "en-us+f4"]}})


def _params(root: Path, nop_file: Path, **ss) -> dict:
    return {
        "sc_stimuli": {
            "nop_set": str(nop_file),
            "nop_categories": 15,
            "nop_per_category": 1,
            "backend": "espeak",
            "rate_wpm": 130,
            "sample_rate": 16000,
            "target_rms_dbfs": -23.0,
            "voices": VOICES,
            "ss_set": {"enabled": bool(ss), "root": str(FIXTURE), "subset": "gender", "min_duration_s": 3.0, **ss},
        },
        "phonation": {"prompts_per_category": None, "max_prompts": None},
    }


@pytest.fixture()
def small_nop(tmp_path):
    """The shipped NOP_set cut to its first starter per category (15 prompts)."""
    doc = yaml.safe_load(NOP.read_text(encoding="utf-8"))
    for c in doc["categories"]:
        c["starters"] = c["starters"][:1]
    path = tmp_path / "nop_small.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    return path


def test_stage_voices_nop_and_ss_prompts_with_four_voices(tmp_path, small_nop):
    out, metrics = tmp_path / "data" / "sc_stimuli", tmp_path / "reports" / "sc_stimuli" / "metrics.json"
    manifest = run_stage(
        _params(tmp_path, small_nop, voicing="sc_voices"), out_dir=out, metrics_path=metrics, root=tmp_path
    )
    assert len(manifest) == (15 + 2) * 4
    per_prompt = manifest.groupby("prompt_id")["voice_gender"].value_counts().unstack()
    assert (per_prompt["male"] == 2).all() and (per_prompt["female"] == 2).all()
    assert set(manifest["voice_id"]) == {"en-us+m3", "en-us+m1", "en-us+f3", "en-us+f4"}
    on_disk = pd.read_csv(out / "manifest.csv")
    assert list(on_disk["stimulus_id"]) == list(manifest["stimulus_id"])
    x, sr = read_audio(tmp_path / manifest["path"].iloc[0])
    assert sr == 16000 and abs(rms_dbfs(x) + 23.0) < 0.1
    m = json.loads(metrics.read_text())
    assert m["prompts"] == {"nop": 15, "ss": 2} and m["stimuli"] == 68 and m["ss_clips_selected"] == 4
    assert json.loads((out / "backend.json").read_text())["backend"] == "espeak"
    prompts = pd.read_csv(out / "prompts.csv")
    assert set(prompts["prompt_set"]) == {"nop", "ss"} and prompts["text"].notna().all()


def test_stage_can_keep_the_dataset_voices(tmp_path, small_nop):
    out, metrics = tmp_path / "data" / "sc_stimuli", tmp_path / "m.json"
    manifest = run_stage(
        _params(tmp_path, small_nop, voicing="original"), out_dir=out, metrics_path=metrics, root=tmp_path
    )
    ss = manifest[manifest["prompt_set"] == "ss"]
    assert len(ss) == 4 and set(ss["backend"]) == {"spoken_stereoset"}
    assert set(ss["voice_id"]) == {"en-US-AvaNeural", "en-US-BrianMultilingualNeural"}
    assert set(ss["prompt_id"]) == {"ss-00000", "ss-00002"} and (ss["sample_rate"] == 16000).all()


def test_stage_voices_only_the_prompts_the_study_converts(tmp_path, small_nop):
    """phonation.prompts_per_category and max_prompts choose the prompts the phonation stage
    converts; sc_stimuli voices only those (prompts.csv still lists every prompt), and each voiced
    file is the same bytes as when every prompt is voiced."""
    full = run_stage(
        _params(tmp_path, small_nop), out_dir=tmp_path / "all", metrics_path=tmp_path / "all.json", root=tmp_path
    )
    params = _params(tmp_path, small_nop, voicing="original")
    params["phonation"] = {"prompts_per_category": 1, "max_prompts": 3}
    some = run_stage(params, out_dir=tmp_path / "some", metrics_path=tmp_path / "some.json", root=tmp_path)
    # one prompt per category here, so the first 3 by id overall (ss-* sorts after nop-*)
    prompts = pd.read_csv(tmp_path / "some" / "prompts.csv")
    assert len(prompts) == 15 + 2
    assert sorted(some["prompt_id"].unique()) == sorted(prompts["prompt_id"])[:3] == ["nop-001", "nop-011", "nop-021"]
    assert len(some) == 3 * 4 and json.loads((tmp_path / "some.json").read_text())["stimuli"] == 12
    for sid, path in zip(some["stimulus_id"], some["path"]):
        same = full.loc[full["stimulus_id"] == sid, "path"].iloc[0]
        assert (tmp_path / path).read_bytes() == (tmp_path / same).read_bytes(), sid
    params["phonation"] = {"prompts_per_category": None, "max_prompts": None}
    both = run_stage(params, out_dir=tmp_path / "ss", metrics_path=tmp_path / "ss.json", root=tmp_path)
    assert set(both.loc[both["prompt_set"] == "ss", "prompt_id"]) == {"ss-00000", "ss-00002"}


def test_manifest_suite_catches_a_prompt_missing_a_voice(tmp_path, small_nop):
    manifest = run_stage(
        _params(tmp_path, small_nop), out_dir=tmp_path / "out", metrics_path=tmp_path / "m.json", root=tmp_path
    )
    with pytest.raises(ValidationFailed, match="voices_for_prompt"):
        validate_sc_manifest(manifest.drop(index=0), 16000, voices_per_prompt=4)


def test_prompts_voiced_on_every_core_equal_one_by_one(tmp_path, small_nop, monkeypatch):
    from voicebias.tts.espeak import EspeakTTS

    files = {}
    for processes in (True, False):
        monkeypatch.setattr(EspeakTTS, "processes", processes)
        out = tmp_path / str(processes) / "data" / "sc_stimuli"
        run_stage(
            _params(tmp_path / str(processes), small_nop),
            out_dir=out,
            metrics_path=tmp_path / str(processes) / "m.json",
            root=tmp_path / str(processes),
        )
        files[processes] = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert len(files[True]) == 15 * 4 + 3 and files[True] == files[False]


def test_manifest_is_checked_once_when_every_prompt_is_voiced_and_twice_with_dataset_voices(
    tmp_path, small_nop, monkeypatch
):
    import voicebias.pipeline.sc_stimuli as stage

    calls = []
    real = stage.validate_sc_manifest

    def counting(manifest, sample_rate, voices_per_prompt=None):
        calls.append((len(manifest), voices_per_prompt))
        return real(manifest, sample_rate, voices_per_prompt)

    monkeypatch.setattr(stage, "validate_sc_manifest", counting)
    run_stage(
        _params(tmp_path / "a", small_nop),
        out_dir=tmp_path / "a" / "out",
        metrics_path=tmp_path / "a" / "m.json",
        root=tmp_path / "a",
    )
    assert calls == [(60, 4)]
    calls.clear()
    run_stage(
        _params(tmp_path / "b", small_nop, voicing="original"),
        out_dir=tmp_path / "b" / "out",
        metrics_path=tmp_path / "b" / "m.json",
        root=tmp_path / "b",
    )
    assert calls == [(60, 4), (64, None)]
