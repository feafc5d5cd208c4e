"""Stage 'continuum' (voicebias.pipeline.continuum) on eSpeak NG renderings: every selected
passage's male and female rendering becomes a checked continuum, written as the manifest says, and
a check that excludes too many steps stops the stage with the counts by reason."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from voicebias import config
from voicebias.audio import read_audio, sha256_file, write_audio
from voicebias.contract import CONTINUUM_COLUMNS
from voicebias.errors import StageFailed
from voicebias.instruments.acoustics import MeasureSettings, measure_signal
from voicebias.params import load_params
from voicebias.pipeline.continuum import run_stage, select_passages
from voicebias.tts import get_backend

TEXTS = {
    "masculine": "He fixed the truck engine in the garage before the football game.",
    "feminine": "She baked a cake for the baby shower and arranged the flowers.",
    "neutral": "The train left the station at noon and arrived in the evening.",
}


@pytest.fixture(scope="module")
def stimuli(tmp_path_factory):
    root = tmp_path_factory.mktemp("continuum")
    tts = get_backend("espeak", rate_wpm=160)
    rows = []
    for pole, text in TEXTS.items():
        for gender, voice in (("male", "en-us+m3"), ("female", "en-us+f3")):
            x, sr = tts.synthesize(text, voice)
            sid = f"en-{pole}-01-{gender}"
            path = root / "data" / "stimuli" / "audio" / f"{sid}.flac"
            write_audio(path, x, sr)
            rows.append(
                {
                    "stimulus_id": sid,
                    "passage_id": f"en-{pole}-01",
                    "lang": "en",
                    "pole": pole,
                    "voice_gender": gender,
                    "voice_id": voice,
                    "sample_rate": sr,
                    "duration_s": len(x) / sr,
                    "path": str(path.relative_to(root)),
                }
            )
    manifest = root / "data" / "stimuli" / "manifest.csv"
    pd.DataFrame(rows).to_csv(manifest, index=False)
    return root, manifest


def _params(**continuum):
    p = load_params(config.ROOT / "profiles" / "embedded.yaml")
    p["continuum"] = {**p["continuum"], **continuum}
    return p


def test_every_base_voice_becomes_a_checked_continuum_written_as_listed(stimuli):
    root, manifest_path = stimuli
    out = run_stage(
        _params(passages_per_pole=1),
        stimuli_manifest_path=manifest_path,
        out_dir=root / "data" / "continuum",
        metrics_path=root / "reports" / "continuum" / "metrics.json",
        root=root,
    )
    assert list(out.columns) == CONTINUUM_COLUMNS
    # the neutral passage is not selected; each of the 2 passages x 2 base voices has 7 steps
    assert len(out) == 2 * 2 * 7 and set(out["pole"]) == {"masculine", "feminine"}
    assert out.groupby("source_stimulus_id")["step"].apply(list).map(lambda s: s == list(range(7))).all()
    assert out["passed"].all(), out.loc[~out["passed"], ["stimulus_id", "f0_error_st", "formant_error_oct", "reason"]]
    metrics = json.loads((root / "reports" / "continuum" / "metrics.json").read_text())
    assert metrics["steps"] == 28 and metrics["excluded"] == 0 and metrics["continua"] == 4 and metrics["passed"]
    assert metrics["worst_f0_error_st"] <= 0.5 and metrics["worst_formant_error_oct"] <= 0.03
    written = pd.read_csv(root / "data" / "continuum" / "manifest.csv")
    assert len(written) == 28
    settings = MeasureSettings.neutral(_params()["acoustics"])
    for r in out.iloc[[3, 17]].to_dict("records"):  # the file is what the check measured
        path = root / r["path"]
        assert sha256_file(path) == r["sha256"]
        x, sr = read_audio(path)
        again = measure_signal(x, sr, settings)
        assert again["f0_median_hz"] == pytest.approx(r["f0_hz"], rel=1e-9)
        assert again["formant_index"] == pytest.approx(r["formant_index"], abs=1e-12)
    # a step's F0 rises along the continuum from both base voices, to the same targets
    for _, g in out.groupby("source_stimulus_id"):
        assert (np.diff(g["f0_hz"]) > 0).all()
    targets = out.groupby("step")["f0_target_hz"].nunique()
    assert (targets == 1).all()


def test_too_many_excluded_steps_stop_the_stage_with_counts_by_reason(stimuli):
    root, manifest_path = stimuli
    with pytest.raises(StageFailed, match=r"excluded \d+ of 28 steps .*f0_off_target"):
        run_stage(
            _params(passages_per_pole=1, languages=["en"], f0_tolerance_st=0.001, corrections=0),
            stimuli_manifest_path=manifest_path,
            out_dir=root / "data" / "continuum-strict",
            metrics_path=root / "reports" / "continuum-strict" / "metrics.json",
            root=root,
        )
    metrics = json.loads((root / "reports" / "continuum-strict" / "metrics.json").read_text())
    assert metrics["excluded_by_reason"]["f0_off_target"] == metrics["excluded"] > 0 and not metrics["passed"]
    assert len(pd.read_csv(root / "data" / "continuum-strict" / "manifest.csv")) == 28  # nothing lost


def test_passages_are_the_first_of_each_pole():
    s = pd.DataFrame(
        [
            {"passage_id": f"en-{pole}-{i:02d}", "lang": "en", "pole": pole, "voice_gender": g}
            for pole in ("masculine", "feminine", "neutral")
            for i in (3, 1, 2)
            for g in ("male", "female")
        ]
    )
    got = select_passages(s, ["en"], ["masculine", "feminine"], 2)
    assert sorted(got["passage_id"].unique()) == [
        "en-feminine-01",
        "en-feminine-02",
        "en-masculine-01",
        "en-masculine-02",
    ]
    assert len(got) == 8
