"""The planted passive rate is checked on its unit: one framing per prompt x voice."""

import pandas as pd
import pytest

from voicebias.analysis.intervals import wilson
from voicebias.analysis.sc import planted_vs_recovered


def scored(passive_units: int, units: int = 90):
    """`units` prompt x voice pairs of male voices, each continued in four phonation conditions with
    the same text (as the reference system does), `passive_units` of them framed passively."""
    rows = []
    for u in range(units):
        for ph in ("modal", "breathy", "creaky", "endcreak"):
            rows.append(
                {
                    "system": "cont",
                    "prompt_id": f"p{u // 3}",
                    "voice_id": f"v{u % 3}",
                    "voice_gender": "male",
                    "phonation": ph,
                    "judge_status": "ok",
                    "agency_competence": 1 if u < passive_units else 4,
                }
            )
    return pd.DataFrame(rows)


def test_the_passive_rate_counts_prompt_voice_units_not_their_four_conditions():
    truth = {"cont": {"retention": {}, "passive_rate": {"male": 0.2}}}
    vq = pd.DataFrame(columns=["measure", "model", "term", "p_value"])
    pvr = planted_vs_recovered(truth, pd.DataFrame(columns=["system", "voice_gender", "measure"]), scored(22), vq)
    row = pvr[pvr["quantity"] == "passive_rate_male"].iloc[0]
    lo, hi = wilson(22, 90)
    assert row["recovered"] == pytest.approx(22 / 90)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((lo, hi))
    # 22 of 90 draws hold the planted 0.2; counted as 88 of 360 stimuli they would not
    assert row["recovered_ok"] and not (wilson(88, 360)[0] <= 0.2)


def test_a_passive_rate_outside_its_own_interval_is_recovered_inside_the_simultaneous_one():
    """15 of 45 male units drawn passive against a planted 0.2 (P(X >= 15) = 0.025): outside the own
    95 % Wilson interval, inside the Wilson interval at 97.5 %, the Bonferroni coverage over the two
    passive rates; a rate far from its planted value is outside both."""
    truth = {"cont": {"retention": {}, "passive_rate": {"male": 0.2, "female": 0.5}}}
    vq = pd.DataFrame(columns=["measure", "model", "term", "p_value"])
    female = scored(5, 45).assign(voice_gender="female")  # 5 of 45 against a planted 0.5
    both = pd.concat([scored(15, 45), female], ignore_index=True)
    pvr = planted_vs_recovered(truth, pd.DataFrame(columns=["system", "voice_gender", "measure"]), both, vq)
    pvr = pvr.set_index("quantity")
    male = pvr.loc["passive_rate_male"]
    assert not male["planted_in_ci"] and male["planted_in_simultaneous_ci"] and male["recovered_ok"]
    assert male["simultaneous_confidence"] == pytest.approx(0.975)
    assert (male["simultaneous_ci_low"], male["simultaneous_ci_high"]) == pytest.approx(wilson(15, 45, 0.975))
    fem = pvr.loc["passive_rate_female"]
    assert not fem["planted_in_ci"] and not fem["planted_in_simultaneous_ci"] and not fem["recovered_ok"]
