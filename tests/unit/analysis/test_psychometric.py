"""Psychometric functions on a voice continuum (voicebias.analysis.psychometric): the estimates and
Fieller intervals pinned to R's `glmer` at test time, planted slopes, boundaries, shifts and lapse
rates recovered, the shift's interval calibrated, and degenerate tables given a status."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from tests.support.continuum_design import CONTINUUM, continuum_answers
from tests.support.rref import run_r
from voicebias.analysis.psychometric import fieller, psychometric_scope, psychometric_table
from voicebias.stimuli.continuum import Continuum

ALPHA = 0.05

R_GLMER = r"""
suppressMessages(library(lme4))
d$pole <- factor(d$pole, levels = c("masculine", "feminine"))
m <- glmer(y ~ pole + x_st + (1 | passage_id) + (1 | base_voice), data = d, family = binomial,
           control = glmerControl(tolPwrss = 1e-12))
b <- fixef(m); V <- as.matrix(vcov(m))
emit("b", b); emit("se", sqrt(diag(V)))
# Fieller's interval for -(c'b) / b_x, written out from its definition (Fieller 1954)
fieller <- function(cc, q) {
  u <- sum(cc * b); v <- b[["x_st"]]
  vu <- drop(t(cc) %*% V %*% cc); vv <- V["x_st", "x_st"]; cuv <- drop(t(cc) %*% V[, "x_st"])
  A <- v^2 - q^2 * vv; B <- 2 * (u * v - q^2 * cuv); C <- u^2 - q^2 * vu
  sort(c(-B - sqrt(B^2 - 4 * A * C), -B + sqrt(B^2 - 4 * A * C)) / (2 * A))
}
q <- qt(0.975, df_pole)
emit("pse_m", -b[["(Intercept)"]] / b[["x_st"]]); emit("pse_m_ci", fieller(c(1, 0, 0), q))
emit("pse_f", -(b[["(Intercept)"]] + b[["polefeminine"]]) / b[["x_st"]]); emit("pse_f_ci", fieller(c(1, 1, 0), q))
emit("shift", -b[["polefeminine"]] / b[["x_st"]]); emit("shift_ci", fieller(c(0, 1, 0), q))
emit("slope_ci", b[["x_st"]] + c(-1, 1) * qt(0.975, df_x) * sqrt(V["x_st", "x_st"]))
"""


@pytest.mark.parametrize("seed,base_voices", [(1, 1), (2, 2), (3, 3)])
def test_estimates_and_intervals_match_glmer(seed, base_voices):
    d = continuum_answers(seed, base_voices=base_voices)
    out = psychometric_scope(d, CONTINUUM, "s", "describe", "en").set_index(["quantity", "pole"])
    assert (out["status"] == "ok").all()
    df_pole = out.loc[("shift", "feminine - masculine"), "df"]
    df_x = out.loc[("slope", ""), "df"]
    assert df_pole == 2 * 10 - 2  # the pole is tested on the passages
    x = d.assign(x_st=[CONTINUUM.semitones(s) for s in d["step"]])
    r = run_r(f"df_pole <- {df_pole}; df_x <- {df_x}\n" + R_GLMER, d=x)
    slope = out.loc[("slope", "")]
    assert slope["estimate"] == pytest.approx(r["b"][2], rel=1e-3)
    assert slope["se"] == pytest.approx(r["se"][2], rel=1e-3)
    for (q, pole), est, ci in (
        (("pse", "masculine"), r["pse_m"], r["pse_m_ci"]),
        (("pse", "feminine"), r["pse_f"], r["pse_f_ci"]),
        (("shift", "feminine - masculine"), r["shift"], r["shift_ci"]),
        (("slope", ""), r["b"][2], r["slope_ci"]),
    ):
        row = out.loc[(q, pole)]
        assert row["estimate"] == pytest.approx(est, rel=1e-3, abs=1e-4)
        width = ci[1] - ci[0]
        # each end within 5 % of the interval's width of R's
        assert abs(row["ci_low"] - ci[0]) <= 0.05 * width and abs(row["ci_high"] - ci[1]) <= 0.05 * width, (q, pole)


def test_fiellers_ends_are_where_the_wald_test_on_the_combination_just_rejects():
    u, v, vu, vv, cuv, q = -3.0, 0.8, 0.4, 0.02, -0.03, 2.1
    lo, hi = fieller(u, v, vu, vv, cuv, q)
    for t in (lo, hi):
        assert abs(u + t * v) / math.sqrt(vu + 2 * t * cuv + t * t * vv) == pytest.approx(q, rel=1e-10)
    mid = -u / v
    assert lo < mid < hi
    assert abs(u + mid * v) / math.sqrt(vu + 2 * mid * cuv + mid * mid * vv) < q


def test_the_continuum_steps_are_equal_in_semitones_and_log_formant_ratio():
    c = Continuum(steps=7, f0_male_hz=120.0, f0_female_hz=220.0, formant_ratio=1.18)
    st = np.diff([c.semitones(s) for s in range(7)])
    lr = np.diff([math.log(c.formant_scale(s)) for s in range(7)])
    np.testing.assert_allclose(st, 12 * math.log2(220 / 120) / 6, rtol=1e-12)
    np.testing.assert_allclose(lr, math.log(1.18) / 6, rtol=1e-12)
    assert c.f0_hz(6) == pytest.approx(220.0) and c.formant_scale(6) == pytest.approx(1.18)
    # the female endpoint's tract is 1 / 1.18 of the male's: 15.25 % shorter
    assert c.vtl_percent(c.span_st) == pytest.approx(100 * (1 / 1.18 - 1))
    assert math.isnan(Continuum(7, 120.0, 220.0, 1.0).vtl_percent(3.0))  # F0 only: the tract never moves
    with pytest.raises(ValueError, match="above the male"):
        Continuum(7, 220.0, 120.0)


def test_planted_slope_boundaries_and_shift_are_recovered_on_a_large_design():
    d = continuum_answers(7, slope=0.8, pse_masculine=6.5, shift=-2.5, passages=60, base_voices=3)
    out = psychometric_scope(d, CONTINUUM, "s", "describe", "en").set_index(["quantity", "pole"])
    for key, planted in (
        (("slope", ""), 0.8),
        (("pse", "masculine"), 6.5),
        (("pse", "feminine"), 4.0),
        (("shift", "feminine - masculine"), -2.5),
    ):
        row = out.loc[key]
        assert row["status"] == "ok" and row["ci_low"] <= planted <= row["ci_high"], (key, row.to_dict())
    shift = out.loc[("shift", "feminine - masculine")]
    assert shift["p_value"] < 1e-6 and bool(shift["follows_voice"])
    # in VTL: a boundary 2.5 st lower sits at a tract 1.18 ** (2.5 / 10.5) - 1 = +4.0 % longer
    assert shift["estimate_vtl_pct"] == pytest.approx(100 * (1.18 ** (-shift["estimate"] / CONTINUUM.span_st) - 1))
    assert shift["ci_low_vtl_pct"] < 100 * (1.18 ** (2.5 / CONTINUUM.span_st) - 1) < shift["ci_high_vtl_pct"]


def test_lapse_rates_are_recovered():
    d = continuum_answers(4, slope=1.5, guess=0.05, lapse=0.10, passages=40, repeats=3, sd_passage=0, sd_voice=0)
    out = psychometric_scope(d, CONTINUUM, "s", "describe", "en").set_index("quantity")
    assert out.loc["guess", "estimate"] == pytest.approx(0.05, abs=0.02)
    assert out.loc["lapse", "estimate"] == pytest.approx(0.10, abs=0.02)


def test_a_flat_function_does_not_follow_the_voice_and_places_no_boundary():
    d = continuum_answers(5, slope=0.0, shift=0.0, passages=20)
    out = psychometric_scope(d, CONTINUUM, "content_driven", "describe", "en").set_index("quantity")
    slope = out.loc["slope"]
    assert slope["status"] == "ok" and slope["ci_low"] <= 0 <= slope["ci_high"] and not slope["follows_voice"]
    pse = out.loc["pse"]
    assert (pse["status"] == "not estimable").all() and pse["estimate"].isna().all()
    assert pse["reason"].str.startswith("does not follow the voice").all()


def test_degenerate_tables_get_a_status_never_an_exception():
    d = continuum_answers(6, slope=10.0, sd_passage=0, sd_voice=0)  # a sharp boundary: separation
    sep = psychometric_scope(d, CONTINUUM, "s", "describe", "en").set_index(["quantity", "pole"])
    assert (sep["status"] == "separation").all()
    assert sep.loc[("pse", "masculine"), "estimate"] == pytest.approx(6.0, abs=1.0)  # Firth's point estimate
    assert sep["ci_low"].isna().all()
    one_pole = psychometric_scope(d[d["pole"] == "masculine"], CONTINUUM)
    assert (one_pole["status"] == "not estimable").all() and "feminine" in one_pole["reason"].iloc[0]
    same = psychometric_scope(d.assign(y=1.0), CONTINUUM)
    assert (same["status"] == "not estimable").all() and "'female'" in same["reason"].iloc[0]
    empty = psychometric_scope(d.assign(y=np.nan), CONTINUUM)
    assert (empty["status"] == "not estimable").all() and (empty["n"] == 0).all()


def test_the_table_has_every_system_task_and_language_and_leaves_failed_calls_out():
    parts = []
    for k, (system, lang) in enumerate([("a", "en"), ("a", "es"), ("b", "en")]):
        parts.append(continuum_answers(10 + k, lang=lang).assign(system=system, task="describe", status="ok"))
    d = pd.concat(parts, ignore_index=True)
    d.loc[d.index[:5], "status"] = "failed"
    t = psychometric_table(d, CONTINUUM)
    scopes = sorted(set(zip(t["system"], t["lang"])))
    assert scopes == [("a", "ALL"), ("a", "en"), ("a", "es"), ("b", "ALL"), ("b", "en")]
    n = t[(t["system"] == "a") & (t["quantity"] == "slope")].set_index("lang")["n"]
    assert n["ALL"] == n["en"] + n["es"] == len(d[(d["system"] == "a") & (d["status"] == "ok")])


def shift_calibration(datasets: int, seed0: int, shift: float) -> tuple[float, float, int]:
    """(share of 95 % intervals covering the planted shift, share of p < .05, fits) over simulated audits."""
    cover, reject, fits = 0, 0, 0
    for seed in range(seed0, seed0 + datasets):
        d = continuum_answers(seed, shift=shift, base_voices=2)
        row = psychometric_scope(d, CONTINUUM).set_index("quantity").loc["shift"]
        if row["status"] != "ok" or not np.isfinite(row["ci_low"]):
            continue
        fits += 1
        cover += row["ci_low"] <= shift <= row["ci_high"]
        reject += row["p_value"] < ALPHA
    return cover / fits, reject / fits, fits


def _bounds(n: int, p: float, lo: float, hi: float) -> tuple[float, float]:
    se = math.sqrt(p * (1 - p) / n)
    return min(lo, p - 3 * se), max(hi, p + 3 * se)


@pytest.mark.parametrize("datasets", [pytest.param(400, marks=pytest.mark.slow), 60])
def test_the_shift_interval_covers_the_planted_shift_and_the_null_rejects_at_most_8_percent(datasets):
    cover, _, fits = shift_calibration(datasets, 1000, shift=-2.0)
    assert fits >= 0.95 * datasets
    lo, hi = _bounds(fits, 0.95, 0.92, 0.98)
    assert lo <= cover <= hi, cover
    _, reject, fits = shift_calibration(datasets, 5000, shift=0.0)
    assert reject <= _bounds(fits, ALPHA, 0.0, 0.08)[1], reject


def test_one_passage_per_pole_gives_estimates_without_intervals():
    d = continuum_answers(8, passages=1, base_voices=3, slope=1.0)
    out = psychometric_scope(d, CONTINUUM).set_index("quantity")
    shift = out.loc["shift"]
    assert shift["df"] == 0 and np.isfinite(shift["estimate"]) and np.isnan(shift["ci_low"])
    assert "no degrees of freedom for the content pole" in shift["reason"]
