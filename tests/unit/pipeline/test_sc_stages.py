"""Speech-continuation analyses on tables with known answers, and the planted continuation system."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.support.sc_tables import _planted_tables
from voicebias.analysis.sc import judge_score_table, retention
from voicebias.instruments.acoustics import MeasureSettings, measure_signal
from voicebias.params import load_params
from voicebias.systems.base import ContinuationRequest
from voicebias.systems.catalog import build_system
from voicebias.systems.reference_continuation import planted_retention, planted_truth, topic_word

SHIFTS = {"breathy": 4.0, "creaky": -3.0, "endcreak": -1.5}


def vq_table(keep: dict[str, float], noise: float = 0.0, prompts: int = 20, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for g, k in keep.items():
        for p in range(prompts):
            base = rng.normal(0, 2)
            for c in ("modal", *SHIFTS):
                dp = SHIFTS.get(c, 0.0)
                rows.append(
                    {
                        "system": "s",
                        "voice_gender": g,
                        "prompt_id": f"p{p}",
                        "phonation": c,
                        "source": "prompt",
                        "h1_h2_db": base + dp + rng.normal(0, noise),
                    }
                )
                rows.append(
                    {
                        "system": "s",
                        "voice_gender": g,
                        "prompt_id": f"p{p}",
                        "phonation": c,
                        "source": "continuation",
                        "h1_h2_db": base + k * dp + rng.normal(0, noise),
                    }
                )
    return pd.DataFrame(rows)


def test_retention_is_exact_without_noise():
    r = retention(vq_table({"male": 0.7, "female": 0.3}), measures=("h1_h2_db",), n_boot=50)
    got = r.set_index("voice_gender")["retention"]
    assert got["male"] == pytest.approx(0.7, abs=1e-12) and got["female"] == pytest.approx(0.3, abs=1e-12)


def test_retention_pairs_each_prompt_once_with_every_system():
    """On the vq_long layout (prompt rows once, no system) retention per system is the
    closed form sum d_p d_c / sum d_p^2 over the conditions, d = condition mean - modal mean."""
    from voicebias.analysis.sc import per_system_view

    one = vq_table({"male": 0.7, "female": 0.3}, noise=0.5, prompts=15, seed=5)
    prompts = one[one["source"] == "prompt"].assign(system=np.nan)
    prompts["stimulus_id"] = prompts["voice_gender"] + prompts["prompt_id"] + prompts["phonation"]
    conts = []
    for s, shift in (("a", 0.0), ("b", 0.8)):
        c = one[one["source"] == "continuation"].copy()
        c["stimulus_id"] = c["voice_gender"] + c["prompt_id"] + c["phonation"]
        c["h1_h2_db"] = c["h1_h2_db"] * (1.0 if s == "a" else 0.5) + shift
        conts.append(c.assign(system=s))
    vq = pd.concat([prompts, *conts], ignore_index=True)
    assert len(per_system_view(vq)) == 2 * len(prompts) + sum(len(c) for c in conts)
    got = retention(vq, measures=("h1_h2_db",), n_boot=20).set_index(["system", "voice_gender"])["retention"]
    for s, c in zip(("a", "b"), conts):
        for g in ("male", "female"):
            mp = prompts[prompts["voice_gender"] == g].groupby("phonation")["h1_h2_db"].mean()
            mc = c[c["voice_gender"] == g].groupby("phonation")["h1_h2_db"].mean()
            dp, dc = (mp - mp["modal"]).drop("modal"), (mc - mc["modal"]).drop("modal")
            assert got[(s, g)] == pytest.approx(float((dp * dc).sum() / (dp * dp).sum()), abs=1e-12)


def test_vq_long_keeps_one_row_per_prompt():
    from voicebias.analysis.sc import vq_long

    pm, sc = _planted_tables({"male": 0.8, "female": 0.2}, prompts=2)
    both = pd.concat([sc, sc.assign(system="other")], ignore_index=True)
    vq = vq_long(both, pm)
    prompts = vq[vq["source"] == "prompt"]
    assert len(prompts) == len(pm) and prompts["stimulus_id"].is_unique and prompts["system"].isna().all()
    assert (vq["source"] == "continuation").sum() == 2 * len(sc)


def test_report_type3_table_shows_untestable_terms_without_p():
    from voicebias.report.build import vq_type3_table

    t3 = pd.DataFrame(
        {
            "measure": "h1_h2_db",
            "model": ["prompt", "continuation - prompt"],
            "term": ["voice_gender", "source:voice_gender:phonation"],
            "f_value": [3.0, 12.5],
            "num_df": [1.0, 3.0],
            "den_df": [2.0, 6.0],
            "p_value": [np.nan, 0.0054],
            "testable": [False, True],
            "note": ["not testable: 2.0 denominator df", ""],
        }
    )
    out = vq_type3_table(t3)
    assert list(out.columns) == ["measure", "model", "term", "F", "df", "p", "note"]
    assert list(out["p"]) == ["–", "0.005**"] and list(out["df"]) == ["1, 2.0", "3, 6.0"]
    assert out.loc[0, "note"].startswith("not testable")


def test_retention_ci_covers_the_planted_share_with_noise():
    r = retention(
        vq_table({"male": 0.7, "female": 0.3}, noise=1.0, prompts=40, seed=3),
        measures=("h1_h2_db",),
        n_boot=300,
        seed=1,
    ).set_index("voice_gender")
    for g, k in (("male", 0.7), ("female", 0.3)):
        assert r.loc[g, "ci_low"] < k < r.loc[g, "ci_high"]
        assert r.loc[g, "ci_high"] - r.loc[g, "ci_low"] < 0.3
    assert r.loc["female", "ci_high"] < r.loc["male", "ci_low"]


def test_judge_score_table_hand_counts():
    scored = pd.DataFrame(
        {
            "system": "s",
            "phonation": ["modal", "modal", "breathy", "breathy", "breathy"],
            "voice_gender": ["male", "male", "male", "female", "female"],
            "judge_status": ["ok"] * 4 + ["failed"],
            "agency_competence": [5, 3, 1, 2, None],
        }
    )
    t = judge_score_table(scored, ["agency_competence"]).set_index(["phonation", "voice_gender"])
    assert t.loc[("modal", "male"), "mean"] == 4.0 and t.loc[("modal", "male"), "n"] == 2
    assert t.loc[("modal", "male"), "sd"] == pytest.approx(np.std([5, 3], ddof=1))
    assert t.loc[("breathy", "female"), "n"] == 1  # the failed judgement is not a score
    assert t.loc[("all", "male"), "mean"] == pytest.approx(3.0)


def test_planted_truth_and_parameter_checks():
    p = {"regularisation": {"male": 0.3, "female": 0.7}, "passive_rate": {"male": 0.2, "female": 0.5}}
    assert planted_truth(p) == {
        "retention": {"male": pytest.approx(0.7), "female": pytest.approx(0.3)},
        "passive_rate": {"male": 0.2, "female": 0.5},
    }
    with pytest.raises(ValueError, match="regularisation.female"):
        planted_retention({"regularisation": {"male": 0.3, "female": 1.5}}, "female")
    assert topic_word("Honestly, I think the most underrated part of any ordinary day is") == "underrated"


def test_reference_continuation_keeps_the_planted_share_of_the_phonation(tmp_path):
    """Same sentence and voice for both conditions of a prompt; the breathy prompt's
    continuation carries (1 - r) of the preset's H1-H2 tilt: 3 SD x 1 dB/SD x keep."""
    stimuli = pd.DataFrame(
        [
            {
                "stimulus_id": f"p1-{g}-{c}",
                "prompt_id": "p1",
                "voice_gender": g,
                "phonation": c,
                "lang": "en",
                "voice_id": "en-us+m3" if g == "male" else "en-us+f3",
                "text": "The most underrated part of any day is",
            }
            for g in ("male", "female")
            for c in ("modal", "breathy")
        ]
    )
    params = {"regularisation": {"male": 0.3, "female": 0.7}, "passive_rate": {"male": 0.0, "female": 0.0}}
    system = build_system("continuation_reference", params, stimuli=stimuli, rate_wpm=130)
    out = {}
    for s in stimuli.itertuples():
        req = ContinuationRequest(
            stimulus_id=s.stimulus_id, lang="en", task="continue", audio_path="", audio_sha256="x", seed=1
        )
        resp = system.call(req)
        assert resp.status == "ok" and resp.transcript.startswith("Thinking about underrated")
        out[s.stimulus_id] = resp
    for g, floor, ceiling, keep in (("male", 60, 300, 0.7), ("female", 100, 500, 0.3)):
        m = {
            c: measure_signal(
                out[f"p1-{g}-{c}"].audio,
                out[f"p1-{g}-{c}"].sample_rate,
                MeasureSettings(floor, ceiling, 5000 if g == "male" else 5500),
            )
            for c in ("modal", "breathy")
        }
        assert out[f"p1-{g}-modal"].transcript == out[f"p1-{g}-breathy"].transcript
        assert m["breathy"]["h1_h2_db"] - m["modal"]["h1_h2_db"] == pytest.approx(3.0 * keep, abs=0.5)
        assert m["breathy"]["cpps_db"] < m["modal"]["cpps_db"]


def test_cli_reanalyses_a_shared_scored_table(tmp_path):
    """`voicebias analyze sc` on tables alone recovers the retention planted in them."""
    import subprocess
    import sys
    from pathlib import Path

    pm, sc = _planted_tables({"male": 0.8, "female": 0.2})
    pm.to_csv(tmp_path / "measures.csv", index=False)
    sc.to_csv(tmp_path / "scored.csv", index=False)
    exe = Path(sys.executable).parent / "voicebias"
    res = subprocess.run(
        [
            str(exe),
            "analyze",
            "sc",
            str(tmp_path / "scored.csv"),
            "--prompt-measures",
            str(tmp_path / "measures.csv"),
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    ret = pd.read_csv(tmp_path / "out" / "retention.csv").set_index(["measure", "voice_gender"])["retention"]
    for m in ("h1_h2_db", "h1_a3_db", "cpps_db"):
        assert ret[(m, "male")] == pytest.approx(0.8, abs=0.05) and ret[(m, "female")] == pytest.approx(0.2, abs=0.05)
    sim = pd.read_csv(tmp_path / "out" / "speaker_similarity.csv")
    assert len(sim) == 8 and (sim["n"] == 12).all()
    t3 = pd.read_csv(tmp_path / "out" / "vq_type3.csv")
    three_way = t3[
        (t3["measure"] == "h1_h2_db")
        & t3["term"].str.contains("source")
        & t3["term"].str.contains("voice_gender")
        & t3["term"].str.contains("phonation")
    ]
    assert float(three_way["p_value"].iloc[0]) < 1e-6
    assert (tmp_path / "out" / "judge_beta_coefficients.csv").exists()
    missing = subprocess.run(
        [
            str(exe),
            "analyze",
            "sc",
            str(tmp_path / "measures.csv"),
            "--prompt-measures",
            str(tmp_path / "measures.csv"),
        ],
        capture_output=True,
        text=True,
    )
    assert missing.returncode != 0 and "missing columns" in missing.stderr and "Traceback" not in missing.stderr


def test_report_tables_have_the_sc_papers_layout():
    """Table 2: rows Unmod./Breathy/Creaky/EndCr., columns system x Male/Female, 'mean ± SD';
    Fig. 2 as a table: one block per dimension, VQ rows with 'All' last."""
    from voicebias.analysis.sc_stats import similarity_table
    from voicebias.report.build import judge_table, sc_similarity_table

    pm, sc = _planted_tables({"male": 0.8, "female": 0.2}, prompts=3)
    sc2 = sc.assign(system="other")
    both = pd.concat([sc, sc2], ignore_index=True)
    t2 = sc_similarity_table(similarity_table(both))
    assert list(t2["VQ Mod."]) == ["Unmod.", "Breathy", "Creaky", "EndCr."]
    assert list(t2.columns) == ["VQ Mod.", "other Male", "other Female", "sys Male", "sys Female"]
    cell = sc[(sc["phonation"] == "breathy") & (sc["voice_gender"] == "male")]["speaker_similarity"]
    assert t2.loc[1, "sys Male"] == f"{cell.mean():.2f} ± {cell.std():.2f}"
    scores = judge_score_table(both, ["agency_competence", "semantic_coherence"])
    jt = judge_table(scores)
    block = jt[jt["dimension"] == "agency_competence"]
    assert list(block["VQ"]) == ["Unmod.", "Breathy", "Creaky", "EndCr.", "All"]


def test_judge_verdicts_are_cached_and_failures_asked_again(tmp_path):
    """Re-scoring never pays twice for a judgement; a failed one is recorded and retried next time."""
    import threading

    from voicebias.instruments.judge import JudgeResult, load_rubric
    from voicebias.scoring.continuation import judge_all

    class CountingJudge:
        def __init__(self):
            self.calls = 0
            self.lock = threading.Lock()

        def judge(self, prompt_text, continuation_text):
            with self.lock:
                self.calls += 1
            if "fail" in continuation_text:
                return JudgeResult("failed", {}, 3, "invalid JSON three times", "counting")
            return JudgeResult("ok", {d: 4 for d in load_rubric()["dimensions"]}, 1, "", "counting", "v1")

    df = pd.DataFrame(
        {
            "stimulus_id": ["a", "b", "c", "d"],
            "status": ["ok", "ok", "ok", "failed"],
            "transcript": ["fine words", "please fail", "", None],
            "prompt_text": ["p"] * 4,
        }
    )
    rubric = load_rubric()
    dims = rubric["dimensions"]
    j = CountingJudge()
    first = judge_all(j, df, dims, {"backend": "counting", "max_concurrency": 3}, rubric, tmp_path)
    assert j.calls == 2
    status = {r["stimulus_id"]: r["judge_status"] for r in first}
    assert status == {"a": "ok", "b": "failed", "c": "not_judged", "d": "not_judged"}
    second = judge_all(j, df, dims, {"backend": "counting", "max_concurrency": 3}, rubric, tmp_path)
    assert j.calls == 3  # only the failed one was asked again
    assert second == first
    judge_all(j, df, dims, {"backend": "counting", "model": "another", "max_concurrency": 1}, rubric, tmp_path)
    assert j.calls == 5  # other judge settings: nothing reused


class _ConstantEmbedder:
    def embed(self, x, sr):
        return np.array([1.0, float(np.std(x)), 0.5])


class _FixedJudge:
    def __init__(self):
        self.seen: list[str] = []

    def judge(self, prompt_text, continuation_text):
        from voicebias.instruments.judge import JudgeResult, load_rubric

        self.seen.append(continuation_text)
        return JudgeResult("ok", {d: 3 for d in load_rubric()["dimensions"]}, 1, "", "fixed", "v1")


def test_a_failed_continuation_is_recorded_as_failed_not_dropped_or_invented(tmp_path):
    """Two stimuli, the second continuation failed: its scored row is kept with status
    'failed', no measures, no similarity and no judge scores, and it counts against
    the system's success rate and drops the stimulus from the all-systems comparison set."""
    from tests.fakes.stimuli import MALE_VOWEL_FORMANTS, synthetic_vowel
    from voicebias import config
    from voicebias.analysis.sc_stats import all_systems_succeeded, success_table
    from voicebias.audio import write_audio
    from voicebias.contract import SC_SCORED_COLUMNS as SCORED_COLUMNS
    from voicebias.instruments.judge import load_rubric
    from voicebias.scoring.continuation import score_continuations

    params = load_params(config.ROOT / "profiles" / "embedded.yaml")
    for name in ("prompt-a", "prompt-b", "cont-a"):
        write_audio(tmp_path / f"{name}.wav", synthetic_vowel(120.0, MALE_VOWEL_FORMANTS["a"], seconds=1.5), 16000)
    manifest = pd.DataFrame(
        {
            "stimulus_id": ["a", "b"],
            "prompt_id": ["p1", "p2"],
            "prompt_set": "s",
            "voice_gender": "male",
            "voice_id": "m1",
            "phonation": "modal",
            "text": ["one prompt", "another prompt"],
            "path": ["prompt-a.wav", "prompt-b.wav"],
        }
    )
    responses = pd.DataFrame(
        {
            "system": "sys",
            "stimulus_id": ["a", "b"],
            "lang": "en",
            "status": ["ok", "failed"],
            "error": ["", "timeout after 3 attempts"],
            "transcript": ["and then she left", None],
            "output_audio": ["cont-a.wav", None],
        }
    )
    judge = _FixedJudge()
    scored = score_continuations(responses, manifest, params, tmp_path, judge=judge, embedder=_ConstantEmbedder())
    assert list(scored.columns[: len(SCORED_COLUMNS)]) == SCORED_COLUMNS and len(scored) == 2
    s = scored.set_index("stimulus_id")
    assert s.loc["a", "status"] == "ok" and np.isfinite(float(s.loc["a", "h1_h2_db"]))
    assert s.loc["a", "speaker_similarity"] == pytest.approx(
        1.0, abs=1e-9
    )  # the continuation is the prompt's own audio
    failed = s.loc["b"]
    assert failed["status"] == "failed" and failed["error"] == "timeout after 3 attempts"
    assert failed["judge_status"] == "not_judged" and failed["judge_error"] == "continuation failed"
    for col in ("h1_h2_db", "h1_a3_db", "cpps_db", "speaker_similarity", *load_rubric()["dimensions"]):
        assert pd.isna(failed[col]), col
    assert judge.seen == ["and then she left"]  # the judge never saw an invented continuation
    assert success_table(scored).iloc[0][["n", "succeeded", "success_rate"]].tolist() == [2, 1, 0.5]
    other = scored.assign(system="sys2", status="ok")
    assert set(all_systems_succeeded(pd.concat([scored, other]))["stimulus_id"]) == {"a"}


def test_a_very_short_continuation_is_scored_as_a_measure_exclusion(tmp_path):
    """A continuation of 20 ms (too short for the pitch analysis) keeps its row: the call
    succeeded, its measures are excluded (NaN), and the other continuation is measured."""
    from tests.fakes.stimuli import MALE_VOWEL_FORMANTS, synthetic_vowel
    from voicebias import config
    from voicebias.audio import write_audio
    from voicebias.scoring.continuation import score_continuations

    params = load_params(config.ROOT / "profiles" / "embedded.yaml")
    for name in ("prompt-a", "prompt-b", "cont-a"):
        write_audio(tmp_path / f"{name}.wav", synthetic_vowel(120.0, MALE_VOWEL_FORMANTS["a"], seconds=1.5), 16000)
    t = np.arange(320) / 16000
    write_audio(tmp_path / "cont-b.wav", (0.3 * np.cos(2 * np.pi * 150 * t)).astype(np.float32), 16000)
    manifest = pd.DataFrame(
        {
            "stimulus_id": ["a", "b"],
            "prompt_id": ["p1", "p2"],
            "prompt_set": "s",
            "voice_gender": "male",
            "voice_id": "m1",
            "phonation": "modal",
            "text": ["one prompt", "another prompt"],
            "path": ["prompt-a.wav", "prompt-b.wav"],
        }
    )
    responses = pd.DataFrame(
        {
            "system": "sys",
            "stimulus_id": ["a", "b"],
            "lang": "en",
            "status": ["ok", "ok"],
            "error": ["", ""],
            "transcript": ["and then she left", "and"],
            "output_audio": ["cont-a.wav", "cont-b.wav"],
        }
    )
    s = score_continuations(
        responses, manifest, params, tmp_path, judge=_FixedJudge(), embedder=_ConstantEmbedder()
    ).set_index("stimulus_id")
    assert list(s["measure_status"]) == ["ok", "excluded"] and list(s["status"]) == ["ok", "ok"]
    assert np.isfinite(float(s.loc["a", "h1_h2_db"]))
    assert s.loc["b", ["h1_h2_db", "h1_a3_db", "cpps_db"]].isna().all()


def test_continue_stage_refuses_before_the_manipulation_check_has_passed(tmp_path):
    from voicebias import config
    from voicebias.io import write_json
    from voicebias.pipeline.sc_continue import run_stage as continue_stage

    params = load_params(config.ROOT / "profiles" / "embedded.yaml")
    out = tmp_path / "continuations" / "continuation_reference"
    for metrics in ({"passed": False, "n": 48}, {}):
        write_json(tmp_path / "check.json", metrics)
        with pytest.raises(RuntimeError, match="manipulation check has not passed; no system may hear"):
            continue_stage(
                params,
                system="continuation_reference",
                manifest_path=tmp_path / "no-manifest.csv",
                check_metrics=tmp_path / "check.json",
                out_dir=out,
                stats_path=tmp_path / "stats.json",
                cache_dir=tmp_path / "cache",
                root=tmp_path,
            )
        # refused before reading the manifest or writing anything
        assert not out.exists() and not (tmp_path / "stats.json").exists() and not (tmp_path / "cache").exists()


def test_continue_stage_runs_through_the_respond_runner(tmp_path, monkeypatch):
    """The continuation stage is the respond stage's runner: every stimulus (whatever its
    language) is one continuation request, finished calls are cached and not repeated,
    the stage record carries the reference system's planted truth, and an S2S system is
    refused before anything is written."""
    import json

    import voicebias.runlog
    from voicebias import config
    from voicebias.errors import ConfigError
    from voicebias.io import write_json, write_table
    from voicebias.pipeline.sc_continue import run_stage as continue_stage

    monkeypatch.setattr(voicebias.runlog, "RUN_LOG", tmp_path / "runs.jsonl")
    params = load_params(config.ROOT / "profiles" / "embedded.yaml")
    manifest = pd.DataFrame(
        [
            {
                "stimulus_id": f"p1-{g}-{c}",
                "prompt_id": "p1",
                "prompt_set": "nop",
                "lang": lang,
                "voice_gender": g,
                "voice_id": "en-us+m3" if g == "male" else "en-us+f3",
                "phonation": c,
                "path": f"p1-{g}-{c}.flac",
                "sha256": f"{i:064x}",
                "text": "The most underrated part of any day is",
            }
            for i, (g, c, lang) in enumerate([("male", "modal", "en"), ("female", "breathy", "es")])
        ]
    )
    write_table(tmp_path / "manifest.csv", manifest)
    write_json(tmp_path / "check.json", {"passed": True})
    args = dict(
        manifest_path=tmp_path / "manifest.csv",
        check_metrics=tmp_path / "check.json",
        out_dir=tmp_path / "out",
        stats_path=tmp_path / "stats.json",
        cache_dir=tmp_path / "cache",
        root=tmp_path,
    )
    with pytest.raises(
        ConfigError, match="system 'voice_faithful' has adapter 'reference', which is not a continuation"
    ):
        continue_stage(params, system="voice_faithful", **args)
    assert not (tmp_path / "out").exists() and not (tmp_path / "stats.json").exists()

    table = continue_stage(params, system="continuation_reference", **args)
    assert sorted(table["stimulus_id"]) == sorted(manifest["stimulus_id"])
    assert (table["task"] == "continue").all() and (table["status"] == "ok").all()
    assert list(table.sort_values("stimulus_id")["phonation"]) == ["breathy", "modal"]  # carried from the manifest
    assert (tmp_path / "out" / "responses.csv").exists()
    assert all((tmp_path / p).exists() for p in table["output_audio"])
    stats = json.loads((tmp_path / "stats.json").read_text())
    truth = params["systems"]["continuation_reference"]
    assert stats["requests"] == 2 and stats["failed"] == 0
    assert stats["planted_truth"]["retention"]["male"] == pytest.approx(1 - truth["regularisation"]["male"])
    again = continue_stage(params, system="continuation_reference", **args)
    assert list(again["cache_key"]) == list(table["cache_key"])
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in runs] == ["sc_continue@continuation_reference"] * 2
    assert (runs[0]["calls"], runs[1]["calls"], runs[1]["cache_hits"]) == (2, 0, 2)

    # a stimulus the manipulation check excluded is heard by no system: not sent, not in the table
    write_table(
        tmp_path / "excluded.csv",
        pd.DataFrame([{"stimulus_id": "p1-female-breathy", "reason": "classifier_flip", "detail": "x"}]),
    )
    kept = continue_stage(params, system="continuation_reference", excluded_path=tmp_path / "excluded.csv", **args)
    assert list(kept["stimulus_id"]) == ["p1-male-modal"]
    assert json.loads((tmp_path / "stats.json").read_text())["requests"] == 1
