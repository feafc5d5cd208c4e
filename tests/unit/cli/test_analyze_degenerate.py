"""`voicebias analyze` on degenerate shared tables: exit 0, rows that say what could not be estimated."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.support.rref import run_r
from tests.support.stats import R_FIRTH_PROFILE_FAR
from voicebias import cli
from voicebias.analysis.stats import describe_design

POLES = ("masculine", "neutral", "feminine")


def content_driven_answers() -> pd.DataFrame:
    """A perfectly content-driven system: 'female' exactly when the content is feminine, both voices,
    eight passages per pole voiced by both voices, in two languages."""
    return pd.DataFrame(
        [
            {
                "system": "api",
                "task": "describe",
                "lang": lang,
                "pole": pole,
                "voice_gender": voice,
                "passage_id": f"{lang}-{pole}-{i}",
                "stimulus_id": f"{lang}-{pole}-{i}-{voice}",
                "judged_gender": "female" if pole == "feminine" else "male",
                "pronoun_choice": "none",
            }
            for lang in ("en", "zh")
            for pole in POLES
            for voice in ("male", "female")
            for i in range(8)
        ]
    )


def test_a_completely_separated_describe_table_exits_0_with_status_separation_and_rs_firth(tmp_path, capsys):
    df = content_driven_answers()
    df.to_csv(tmp_path / "api.csv", index=False)
    assert cli.main(["analyze", "describe", str(tmp_path / "api.csv"), "--out", str(tmp_path / "out")]) == 0
    assert "Traceback" not in capsys.readouterr().err
    odds = pd.read_csv(tmp_path / "out" / "describe_odds_ratios.csv").set_index("lang")
    assert set(odds.index) == {"ALL", "en", "zh"}
    assert (odds["status"] == "separation").all() and (odds["fit_status"] == "perfect separation (complete)").all()
    for lang, rows in (("ALL", df), ("en", df[df["lang"] == "en"])):
        d = describe_design(rows)
        ref = run_r(R_FIRTH_PROFILE_FAR, d=d[["content_step", "voice_female", "y"]])
        assert np.isfinite(ref["ci_low"]) and np.isfinite(ref["ci_high"])  # R's profile crosses on both sides
        # the acceptance asks 1e-4 relative; the CSV round trip keeps about 15 digits
        assert odds.loc[lang, "firth_odds_ratio"] == pytest.approx(np.exp(ref["coef"]), rel=1e-6)
        assert odds.loc[lang, "firth_ci_low"] == pytest.approx(np.exp(ref["ci_low"]), rel=1e-6)
        assert odds.loc[lang, "firth_ci_high"] == pytest.approx(np.exp(ref["ci_high"]), rel=1e-6)
    fisher = pd.read_csv(tmp_path / "out" / "describe_fisher.csv")
    # the misaligned cells misgender always, the neutral ones of the female voice always, of the male voice never
    assert set(fisher["status"]) <= {"ok", "separation"} and fisher["p_value"].notna().all()


@pytest.mark.parametrize("what,answers", [("describe", "none"), ("summarize", "none"), ("summarize", "female")])
def test_one_answer_class_exits_0_with_reasons(tmp_path, capsys, what, answers):
    df = content_driven_answers().assign(task=what, judged_gender=answers, pronoun_choice=answers)
    df.to_csv(tmp_path / "t.csv", index=False)
    assert cli.main(["analyze", what, str(tmp_path / "t.csv"), "--out", str(tmp_path / "out")]) == 0
    name = "describe_odds_ratios" if what == "describe" else "summarize_pronouns"
    out = pd.read_csv(tmp_path / "out" / f"{name}.csv")
    if answers == "none":
        assert (out["status"] == "not estimable").all() and out["reason"].str.len().gt(0).all()
    else:  # every summary says 'she': P(she) 1 at every pole, the slope 0 and defined
        assert (out["status"] == "ok").all() and (out["delta_pp"] == 0).all()
