"""The SC judge scores with voices and prompts random (sc_stats.judge_mixed_model): pinned to
lmerTest at test time, and its size under a null with voice and prompt variation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.support.rref import run_r
from voicebias.analysis.sc_stats import JUDGE_MIXED_MODEL, judge_mixed_model, rescale_scores
from voicebias.analysis.status import NotEstimable

PHON = ("breathy", "creaky", "modal")


def judged(seed, voices=3, prompts=10, gender=0.0, sd_voice=0.3, sd_prompt=0.3, sd_vp=0.15, systems=1):
    """Likert 1-5 judge scores: a latent logit with voice, prompt, voice x phonation effects and an
    optional planted gender effect, cut into five categories."""
    rng = np.random.default_rng(seed)
    rows = []
    vs = [(f"{g[0]}{i}", g) for g in ("male", "female") for i in range(voices)]
    a = {v: rng.normal(0, sd_voice) for v, _ in vs}
    b = {p: rng.normal(0, sd_prompt) for p in range(prompts)}
    c = {(v, ph): rng.normal(0, sd_vp) for v, _ in vs for ph in PHON}
    for v, g in vs:
        for p in range(prompts):
            for ph in PHON:
                for k in range(systems):
                    latent = a[v] + b[p] + c[(v, ph)] + (gender if g == "male" else -gender) + rng.logistic(0, 0.6)
                    score = int(np.clip(np.round(3 + 1.5 * latent), 1, 5))
                    rows.append(
                        {
                            "system": f"s{k}",
                            "voice_id": v,
                            "voice_gender": g,
                            "prompt_id": f"p{p:02d}",
                            "phonation": ph,
                            "agency": float(score),
                        }
                    )
    return pd.DataFrame(rows)


LMER = r"""
# rows in the formula's order: voice_gender, phonation, voice_gender:phonation (with systems: system first)
suppressMessages(library(lmerTest))
options(contrasts = c("contr.sum", "contr.poly"))
for (f in c("system", "voice_gender", "phonation")) d[[f]] <- factor(d[[f]], levels = sort(unique(d[[f]])))
ctl <- lmerControl(optimizer = "bobyqa", optCtrl = list(rhoend = 1e-12, maxfun = 1e6))
f <- d ~ voice_gender * phonation + (1 | voice_id) + (1 | voice_id:phonation) + (1 | prompt_id) +
  (1 | prompt_id:phonation)
if (length(unique(d$system)) > 1) f <- d ~ system * voice_gender * phonation + (1 | voice_id) +
  (1 | voice_id:phonation) + (1 | prompt_id) + (1 | prompt_id:phonation) + (1 | voice_id:system) +
  (1 | voice_id:phonation:system) + (1 | prompt_id:system)
m <- lmer(f, data = d, REML = TRUE, control = ctl)
a <- anova(m, type = 3, ddf = "Satterthwaite")
emit("F", a[["F value"]]); emit("ddf", a[["DenDF"]]); emit("p", a[["Pr(>F)"]])
emit("vc", as.data.frame(VarCorr(m))$vcov)
"""


@pytest.mark.parametrize("systems,seed", [(1, 2), (2, 5)])
def test_judge_mixed_model_matches_lmertest(systems, seed):
    df = judged(seed, systems=systems, gender=0.3)
    t3, fit = judge_mixed_model(df, "agency", min_df=0.0)
    y = rescale_scores(df["agency"])
    r = run_r(LMER, d=df.assign(d=np.log(y / (1 - y))))
    assert fit["status"] == "ok" and fit["model"] == JUDGE_MIXED_MODEL
    assert fit["generalises_over"] == "3 voices per gender, 10 prompts (random)"
    # R's anova lists the terms in the formula's order, as the sum-coded factorial here does
    assert len(t3) == len(np.atleast_1d(r["F"])) == (3 if systems == 1 else 7)
    np.testing.assert_allclose(t3["f_value"], r["F"], rtol=1e-4, atol=2e-6)
    np.testing.assert_allclose(t3["den_df"], r["ddf"], rtol=1e-4)
    np.testing.assert_allclose(t3["p_value"], r["p"], rtol=1e-4, atol=1e-10)
    vc = [float(part.split("=")[1]) for part in fit["variance_components"].split("; ")]
    # the fit's row prints each component to 4 significant digits: R's, rounded alike, are the same
    # numbers (a component on the boundary is 0 here and ~1e-13 in lme4's bobyqa)
    r_vc = sorted(float(f"{x:.4g}") for x in np.atleast_1d(r["vc"]))
    np.testing.assert_allclose(sorted(vc), r_vc, rtol=1e-12, atol=1e-10)


def test_a_planted_gender_effect_is_tested_on_the_voices():
    t3, _ = judge_mixed_model(judged(12, voices=4, gender=0.8), "agency")
    g = t3.set_index("term").loc["voice_gender"]
    assert g["testable"] and g["p_value"] < 0.01
    assert g["den_df"] == pytest.approx(4 * 2 - 2, abs=0.5)  # voices - 2


def test_gender_claims_hold_their_size_with_voice_and_prompt_variation_reduced():
    """30 null designs with 3 voices per gender (docs/analysis.md has the 200-design grid): the
    gender and gender x phonation terms reject at .05 in at most 4 of 30 each."""
    rejections = np.zeros(2)
    for seed in range(30):
        t3 = judge_mixed_model(judged(500 + seed, prompts=8), "agency")[0].set_index("term")
        rejections += [t3.loc["voice_gender", "p_value"] < 0.05, t3.loc["voice_gender:phonation", "p_value"] < 0.05]
    assert (rejections <= 4).all(), rejections


def test_tables_it_cannot_model_say_why():
    df = judged(1)
    with pytest.raises(NotEstimable, match="no prompt_id column"):
        judge_mixed_model(df.drop(columns="prompt_id"), "agency")
    with pytest.raises(NotEstimable, match="constant scores"):
        judge_mixed_model(df.assign(agency=3.0), "agency")
    with pytest.raises(NotEstimable, match="1 voice"):
        judge_mixed_model(df[df["voice_id"] == "m0"], "agency")


def test_a_term_the_scores_do_not_vary_along_is_not_tested():
    """The same continuation text in every phonation condition of a prompt x voice: phonation has F 0."""
    df = judged(3)
    same = df.groupby(["voice_id", "prompt_id"])["agency"].transform("first")
    t3 = judge_mixed_model(df.assign(agency=same), "agency")[0].set_index("term")
    for term in ("phonation", "voice_gender:phonation"):
        assert not t3.loc[term, "testable"] and np.isnan(t3.loc[term, "p_value"])
        assert t3.loc[term, "status"] == "not estimable" and "do not vary" in t3.loc[term, "reason"]
    assert t3.loc["voice_gender", "testable"] and np.isfinite(t3.loc["voice_gender", "p_value"])
