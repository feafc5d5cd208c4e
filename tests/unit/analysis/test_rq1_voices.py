"""RQ1's mixed model with input voices as a random effect, pinned to lmerTest and emmeans in R."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.support.rref import run_r
from voicebias.analysis.rq1 import rq1_mixed_models

R_VOICES = r"""
suppressMessages({library(lmerTest); library(emmeans)})
d$pole <- factor(d$pole, levels = c("neutral", "feminine", "masculine"))
d$voice_gender <- factor(d$voice_gender, levels = c("female", "male"))
m <- lmer(delta_composite ~ pole * voice_gender + (1 | passage_id) + (1 | voice_id), data = d, REML = TRUE,
          control = lmerControl(optimizer = "bobyqa", optCtrl = list(rhobeg = 1e-3, rhoend = 1e-12)))
emm <- emmeans(m, ~ pole * voice_gender, lmer.df = "satterthwaite")
g <- as.data.frame(emm)[, c("pole", "voice_gender")]
stereo <- ifelse(g$pole == "feminine", 0.25, ifelse(g$pole == "masculine", -0.25, 0))
mis <- ifelse(g$voice_gender == "male", ifelse(g$pole == "feminine", 0.5, ifelse(g$pole == "neutral", -0.5, 0)),
              ifelse(g$pole == "masculine", -0.5, ifelse(g$pole == "neutral", 0.5, 0)))
ct <- summary(contrast(emm, list(stereo = stereo, mis = mis)), infer = TRUE)
emit("est", ct$estimate); emit("se", ct$SE); emit("df", ct$df); emit("p", ct$p.value)
b <- fixef(m); V <- as.matrix(vcov(m)); i <- grep(":", names(b))
emit("chi2", as.numeric(t(b[i]) %*% solve(V[i, i]) %*% b[i]))
a <- anova(m, type = 3); emit("den_df", a[nrow(a), "DenDF"])
vc <- as.data.frame(VarCorr(m))
emit("vc_passage", vc$vcov[vc$grp == "passage_id"]); emit("vc_voice", vc$vcov[vc$grp == "voice_id"])
"""


def voiced_table(voice_sd=0.4, passage_sd=0.2, noise=0.2, drift=0.1, seed=4, voices=3):
    """One language, 30 passages (10 per pole), each read once per gender; `voices` voices per
    gender in rotation, each with its own offset; a planted pull toward the stereotype."""
    rng = np.random.default_rng(seed)
    offsets = {(g, i): rng.normal(0, voice_sd) for g in ("male", "female") for i in range(voices)}
    rows = []
    for k, (pole, i) in enumerate((pole, i) for pole in ("masculine", "neutral", "feminine") for i in range(10)):
        pid = f"en-{pole}-{i:02d}"
        u = rng.normal(0, passage_sd)
        for gender in ("male", "female"):
            v = k % voices
            shift = {"feminine": drift, "masculine": -drift, "neutral": 0.0}[pole]
            rows.append(
                {
                    "system": "s",
                    "lang": "en",
                    "task": "readback",
                    "pole": pole,
                    "voice_gender": gender,
                    "voice_id": f"{gender[0]}{v}",
                    "passage_id": pid,
                    "stimulus_id": f"{pid}-{gender}",
                    "status": "ok",
                    "delta_composite": (1.0 if gender == "male" else -0.5)
                    + offsets[(gender, v)]
                    + shift
                    + u
                    + rng.normal(0, noise),
                }
            )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("seed", [4, 9])
def test_the_voice_model_matches_lmertest_to_1e_4(seed):
    g = voiced_table(seed=seed)
    ours = rq1_mixed_models(g).iloc[0]
    ref = run_r(R_VOICES, d=g[["delta_composite", "pole", "voice_gender", "passage_id", "voice_id"]])
    assert ours["random_effects"] == "passage + voice" and ours["voices_per_gender"] == 3
    assert ours["converged"] and ours["status"] == "ok" and ref["vc_voice"] > 0 and ref["vc_passage"] > 0
    for i, eff in enumerate(("stereotype_effect", "misaligned_minus_neutral")):
        assert ours[f"{eff}_est"] == pytest.approx(ref["est"][i], rel=1e-4, abs=1e-8)
        assert ours[f"{eff}_se"] == pytest.approx(ref["se"][i], rel=1e-4)
        assert ours[f"{eff}_df"] == pytest.approx(ref["df"][i], rel=1e-4)
        assert ours[f"{eff}_p"] == pytest.approx(ref["p"][i], rel=1e-4, abs=1e-10)
    assert ours["chi2_interaction"] == pytest.approx(ref["chi2"], rel=1e-4)
    assert ours["den_df_interaction"] == pytest.approx(ref["den_df"], rel=1e-4)


def test_with_one_voice_per_gender_the_model_has_no_voice_term():
    g = voiced_table(voices=1)
    ours = rq1_mixed_models(g).iloc[0]
    assert ours["random_effects"] == "passage" and ours["voices_per_gender"] == 1


def test_voice_offsets_leave_the_residual_and_the_rotation_does_not_bias_the_pull():
    """Voice offsets (SD 1) and rotated voices: a model without voices puts their variance in the
    residual and takes the voices' unequal shares of the poles as content noise; the voice model
    recovers the planted pull toward the stereotype (0.1 per step) with an interval a third as wide."""
    g = voiced_table(voice_sd=1.0, passage_sd=0.1, noise=0.05, drift=0.1, seed=5)
    with_voice = rq1_mixed_models(g).iloc[0]
    without = rq1_mixed_models(g.drop(columns="voice_id")).iloc[0]
    assert without["random_effects"] == "passage"
    assert with_voice["stereotype_effect_ci_low"] <= 0.1 <= with_voice["stereotype_effect_ci_high"]
    assert with_voice["stereotype_effect_se"] < without["stereotype_effect_se"] / 3
