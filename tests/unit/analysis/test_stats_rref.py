"""The S2S statistics (voicebias.analysis.stats, voicebias.analysis.rq1, voicebias.analysis.s2s) against R
on the same tables.

Every number is computed by R at test time (tests/support/rref.py); a missing R fails, it never skips.
References: glm (logistic OR per step, Wald CI), brglm2 (Firth, method "brglmFit", type "AS_mean"),
a profile of the penalised likelihood maximised in R by optim (Firth CI and LRT p), fisher.test,
lmerTest + emmeans (RQ1 mixed model, REML, Satterthwaite df), t.test (Welch), prop.test (Wilson).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm

from tests.support.rref import run_r
from tests.support.stats import R_FIRTH_PROFILE_FAR, deltas, mixed_table, singular_table, table
from voicebias.analysis.intervals import wilson
from voicebias.analysis.rq1 import rq1_contrasts, rq1_mixed_models, rq1_pooled
from voicebias.analysis.stats import (
    describe_design,
    firth_coefficient,
    fisher_misaligned_vs_neutral,
    misgender_rates,
    odds_ratio_per_step,
)

POLES = ("masculine", "neutral", "feminine")

# penalised log-likelihood and its profile over coefficient 2 (content), maximised from two starts
R_FIRTH_PROFILE = r"""
suppressMessages(library(brglm2))
X <- cbind(1, d$content_step, d$voice_female); y <- d$y
pl <- function(b) { eta <- X %*% b; p <- 1 / (1 + exp(-eta)); w <- as.vector(p * (1 - p))
  v <- sum(y * eta - log1p(exp(eta))) + 0.5 * determinant(crossprod(X * sqrt(w)), logarithm = TRUE)$modulus
  if (is.finite(v)) v else -1e10 }
fit <- glm(y ~ content_step + voice_female, family = binomial, data = d, method = "brglmFit", type = "AS_mean",
           control = list(epsilon = 1e-12, maxit = 500))
bhat <- coef(fit); lmax <- pl(bhat)
prof <- function(v) max(sapply(list(c(0, 0), bhat[-2]), function(s)
  -optim(s, function(a) -pl(c(a[1], v, a[2])), method = "BFGS", control = list(reltol = 1e-15, maxit = 10000))$value))
f <- function(v) 2 * (lmax - prof(v)) - qchisq(0.95, 1)
emit("coef", bhat[2])
far <- function(dir) { s <- 0.5; while (f(bhat[2] + dir * s) <= 0) s <- 2 * s; bhat[2] + dir * s }
emit("ci_low", uniroot(f, c(far(-1), bhat[2]), tol = 1e-11)$root)
emit("ci_high", uniroot(f, c(bhat[2], far(1)), tol = 1e-11)$root)
emit("p", pchisq(2 * (lmax - prof(0)), 1, lower.tail = FALSE))
"""


def describe_rows(seed: int, p_female: dict) -> pd.DataFrame:
    """Describe answers, 30 per pole x voice cell in two languages, with P(female) per cell."""
    rng = np.random.default_rng(seed)
    rows = []
    for lang in ("en", "zh"):
        for (pole, voice), p in p_female.items():
            for _ in range(30):
                rows.append(
                    {
                        "lang": lang,
                        "pole": pole,
                        "voice_gender": voice,
                        "judged_gender": "female" if rng.random() < p else "male",
                    }
                )
    return pd.DataFrame(rows)


def test_odds_ratio_per_step_matches_glm():
    p = {
        (pole, v): 1 / (1 + np.exp(-(-1.2 + 0.9 * i + (1.5 if v == "female" else 0.0))))
        for i, pole in enumerate(POLES)
        for v in ("male", "female")
    }
    df = describe_rows(3, p)
    ours = odds_ratio_per_step(df).iloc[0]
    ref = run_r(
        """
fit <- glm(y ~ content_step + voice_female, family = binomial, data = d, control = list(epsilon = 1e-14, maxit = 100))
s <- summary(fit)$coefficients; ci <- confint.default(fit)
emit("coef", s[2, 1]); emit("se", s[2, 2]); emit("p", s[2, 4]); emit("lo", exp(ci[2, 1])); emit("hi", exp(ci[2, 2]))
suppressMessages(library(brglm2))
firth <- update(fit, method = "brglmFit", type = "AS_mean", control = list(epsilon = 1e-12, maxit = 500))
emit("firth_or", exp(coef(firth)[2]))
""",
        d=describe_design(df)[["content_step", "voice_female", "y"]],
    )
    assert ours["fit_status"] == "ok"
    assert ours["coef"] == pytest.approx(ref["coef"], abs=1e-7)
    assert ours["se"] == pytest.approx(ref["se"], abs=1e-7)
    assert ours["p_value"] == pytest.approx(ref["p"], rel=1e-5)
    assert ours["ci_low"] == pytest.approx(ref["lo"], rel=1e-6) and ours["ci_high"] == pytest.approx(
        ref["hi"], rel=1e-6
    )
    assert ours["firth_odds_ratio"] == pytest.approx(ref["firth_or"], rel=1e-6)


@pytest.mark.parametrize(
    "name,counts",
    [
        # overlapping data: the Firth estimate is near the MLE
        (
            "overlap",
            {
                ("masculine", "male"): (3, 17),
                ("masculine", "female"): (9, 11),
                ("neutral", "male"): (6, 14),
                ("neutral", "female"): (12, 8),
                ("feminine", "male"): (11, 9),
                ("feminine", "female"): (16, 4),
            },
        ),
        # complete separation by content (masculine and neutral all 'male', feminine all 'female')
        (
            "content separates",
            {
                **{("masculine", v): (0, 10) for v in ("male", "female")},
                **{("neutral", v): (0, 10) for v in ("male", "female")},
                **{("feminine", v): (10, 0) for v in ("male", "female")},
            },
        ),
        # complete separation by content and voice together: the constrained fit has a saddle point and two maxima
        (
            "content and voice separate",
            {
                ("masculine", "male"): (0, 10),
                ("masculine", "female"): (0, 10),
                ("neutral", "male"): (0, 10),
                ("neutral", "female"): (10, 0),
                ("feminine", "male"): (10, 0),
                ("feminine", "female"): (10, 0),
            },
        ),
    ],
)
def test_firth_estimate_profile_ci_and_p_match_r(name, counts):
    d = describe_design(table(counts))
    X = sm.add_constant(d[["content_step", "voice_female"]].to_numpy(), has_constant="add")
    ours = firth_coefficient(X, d["y"].to_numpy(), 1)
    ref = run_r(R_FIRTH_PROFILE, d=d[["content_step", "voice_female", "y"]])
    assert ours["coef"] == pytest.approx(ref["coef"], abs=1e-6)
    # the upper bound under separation used to stop 0.05 % short (11.3860 vs 11.3916)
    assert ours["ci_low"] == pytest.approx(ref["ci_low"], abs=1e-6)
    assert ours["ci_high"] == pytest.approx(ref["ci_high"], abs=1e-6)
    assert ours["p_value"] == pytest.approx(ref["p"], rel=1e-5)


def content_separated(per_cell: int) -> dict:
    """'female' exactly when the content is feminine, in both voices: complete separation on the content step."""
    return {(p, v): ((per_cell, 0) if p == "feminine" else (0, per_cell)) for p in POLES for v in ("male", "female")}


@pytest.mark.parametrize(
    "name,counts",
    [
        # the table that stopped the describe analysis ("Firth fit did not converge in 500 steps")
        ("content separates, 12 per cell", content_separated(12)),
        # the profile's constrained maximum leaves the symmetric saddle (voice 0) for one of two higher maxima
        ("content separates, 30 per cell", content_separated(30)),
        # the estimate runs away with n (about log n): log OR 11.2, its upper bound 15.9 (|eta| near 30 on the profile)
        ("content separates, 100 per cell", content_separated(100)),
        (
            "quasi-complete: neutral split",
            {
                **{("masculine", v): (0, 12) for v in ("male", "female")},
                **{("neutral", v): (6, 6) for v in ("male", "female")},
                **{("feminine", v): (12, 0) for v in ("male", "female")},
            },
        ),
        (
            "quasi-complete: neutral differs by voice",
            {
                **{("masculine", v): (0, 10) for v in ("male", "female")},
                ("neutral", "male"): (2, 8),
                ("neutral", "female"): (7, 3),
                **{("feminine", v): (10, 0) for v in ("male", "female")},
            },
        ),
        ("every answer female", {(p, v): (8, 0) for p in POLES for v in ("male", "female")}),
    ],
)
def test_firth_under_separation_matches_brglm2_and_the_penalised_profile_in_r(name, counts):
    """The describe row under separation: status 'separation', the Firth estimate of brglm2 and the
    profile-likelihood bounds of R's profile of the penalised likelihood (each side infinite where R's
    profile does not cross the level within 1024 of the estimate; in these tables it crosses on both
    sides). The brief asks 1e-4 relative; the agreement measured is about 1e-11."""
    df = table(counts)
    d = describe_design(df)
    ref = run_r(R_FIRTH_PROFILE_FAR, d=d[["content_step", "voice_female", "y"]])
    X = sm.add_constant(d[["content_step", "voice_female"]].to_numpy(), has_constant="add")
    ours = firth_coefficient(X, d["y"].to_numpy(), 1)
    assert ours["coef"] == pytest.approx(ref["coef"], rel=1e-6, abs=1e-9)
    for side in ("ci_low", "ci_high"):
        if np.isinf(ref[side]):
            assert ours[side] == ref[side]
        else:
            assert ours[side] == pytest.approx(ref[side], rel=1e-6)
    assert ours["p_value"] == pytest.approx(ref["p"], rel=1e-5, abs=1e-300)
    row = odds_ratio_per_step(df).iloc[0]
    assert row["status"] == "separation" and row["fit_status"] != "ok" and "Firth" in row["reason"]
    assert np.isnan(row["odds_ratio"])
    assert row["firth_odds_ratio"] == pytest.approx(np.exp(ref["coef"]), rel=1e-6)
    assert row["firth_ci_low"] == pytest.approx(np.exp(ref["ci_low"]), rel=1e-6)
    assert row["firth_ci_high"] == pytest.approx(np.exp(ref["ci_high"]), rel=1e-6)


def test_fisher_within_voice_reproduces_the_papers_test_and_matches_fisher_test():
    # S2S paper, GLM-4-Voice, Mandarin, male voice: judged female 5/10 on feminine content vs 0/10 on neutral;
    # female voice: 2/10 judged male on masculine content vs 1/10 on neutral.
    df = table(
        {
            ("feminine", "male"): (5, 5),
            ("neutral", "male"): (0, 10),
            ("masculine", "female"): (8, 2),
            ("neutral", "female"): (9, 1),
        }
    ).assign(lang="zh")
    per_voice = fisher_misaligned_vs_neutral(misgender_rates(df, by_voice=True))
    pooled = fisher_misaligned_vs_neutral(misgender_rates(df))
    male = per_voice[(per_voice["lang"] == "zh") & (per_voice["voice_gender"] == "male")].iloc[0]
    both = pooled[pooled["lang"] == "zh"].iloc[0]
    assert (male["misaligned_misgendered"], male["misaligned_n"], male["neutral_misgendered"], male["neutral_n"]) == (
        5,
        10,
        0,
        10,
    )
    assert both["voice_gender"] == "pooled" and (both["misaligned_misgendered"], both["neutral_misgendered"]) == (7, 1)
    ref = run_r("""
m <- fisher.test(matrix(c(5, 0, 5, 10), 2)); p <- fisher.test(matrix(c(7, 1, 13, 19), 2))
emit("p_male", m$p.value); emit("hi_male", m$conf.int[2]); emit("p_pooled", p$p.value)
# fisher.test's conditional MLE and CI come from uniroot at its default tolerance (1e-4 absolute, on 1/ncp for
# large values); the same noncentral hypergeometric equations solved on log(ncp) to 1e-12 are the reference
cond <- function(x11, m, n, k) {
  s <- max(0, k - n):min(k, m); logdc <- dhyper(s, m, n, k, log = TRUE)
  dn <- function(l) { d <- logdc + l * s; d <- exp(d - max(d)); d / sum(d) }
  root <- function(f) uniroot(f, c(-30, 30), tol = 1e-12)$root
  c(if (x11 == max(s)) Inf else exp(root(function(l) sum(s * dn(l)) - x11)),
    if (x11 == min(s)) 0 else exp(root(function(l) sum(dn(l)[s >= x11]) - 0.025)),
    if (x11 == max(s)) Inf else exp(root(function(l) sum(dn(l)[s <= x11]) - 0.025)))
}
r <- cond(7, 8, 32, 20); emit("or_pooled", r[1]); emit("lo_pooled", r[2]); emit("hi_pooled", r[3])
emit("lo_male", cond(5, 5, 15, 10)[2])
emit("fisher_test_or_pooled", p$estimate)
""")
    assert male["p_value"] == pytest.approx(ref["p_male"], rel=1e-9)
    assert round(male["p_value"], 2) == 0.03  # the paper's "Fisher p = 0.03"
    assert both["p_value"] == pytest.approx(ref["p_pooled"], rel=1e-9)
    assert both["conditional_odds_ratio"] == pytest.approx(ref["or_pooled"], rel=1e-6)
    assert both["conditional_odds_ratio"] == pytest.approx(ref["fisher_test_or_pooled"], rel=1e-3)
    assert both["ci_low"] == pytest.approx(ref["lo_pooled"], rel=1e-6)
    assert both["ci_high"] == pytest.approx(ref["hi_pooled"], rel=1e-6)
    assert male["ci_low"] == pytest.approx(ref["lo_male"], rel=1e-6)
    assert np.isinf(male["ci_high"]) and np.isinf(ref["hi_male"]) and np.isinf(male["odds_ratio"])
    assert both["odds_ratio"] == pytest.approx(7 * 19 / (13 * 1))  # sample odds ratio ad/bc


R_MIXED = r"""
suppressMessages({library(lmerTest); library(emmeans)})
d$pole <- factor(d$pole, levels = c("neutral", "feminine", "masculine"))
d$voice_gender <- factor(d$voice_gender, levels = c("female", "male"))
m <- lmer(delta_composite ~ pole * voice_gender + (1 | passage_id), data = d, REML = TRUE,
          control = lmerControl(optimizer = "bobyqa", optCtrl = list(rhobeg = 1e-3, rhoend = 1e-12)))
emm <- emmeans(m, ~ pole * voice_gender, lmer.df = "satterthwaite")
g <- as.data.frame(emm)[, c("pole", "voice_gender")]
stereo <- ifelse(g$pole == "feminine", 0.25, ifelse(g$pole == "masculine", -0.25, 0))
mis <- ifelse(g$voice_gender == "male", ifelse(g$pole == "feminine", 0.5, ifelse(g$pole == "neutral", -0.5, 0)),
              ifelse(g$pole == "masculine", -0.5, ifelse(g$pole == "neutral", 0.5, 0)))
ct <- summary(contrast(emm, list(stereo = stereo, mis = mis)), infer = TRUE)
emit("est", ct$estimate); emit("se", ct$SE); emit("df", ct$df); emit("lo", ct$lower.CL); emit("hi", ct$upper.CL)
emit("p", ct$p.value)
b <- fixef(m); V <- as.matrix(vcov(m)); i <- grep(":", names(b))
emit("chi2", as.numeric(t(b[i]) %*% solve(V[i, i]) %*% b[i]))
emit("vc", as.data.frame(VarCorr(m))$vcov)
"""


@pytest.mark.parametrize("case", ["interior passage variance", "singular fit"])
def test_rq1_mixed_model_effects_match_lmertest_and_emmeans(case):
    g = mixed_table() if case == "interior passage variance" else singular_table()
    ours = rq1_mixed_models(g).iloc[0]
    ref = run_r(
        R_MIXED + 'emit("singular", isSingular(m))', d=g[["delta_composite", "pole", "voice_gender", "passage_id"]]
    )
    assert ours["units"] == "SD" and ours["converged"]
    assert ("singular fit" in ours["warning"]) == (case == "singular fit") == bool(ref["singular"])
    assert ours["n"] == len(g)
    for i, eff in enumerate(("stereotype_effect", "misaligned_minus_neutral")):
        assert ours[f"{eff}_est"] == pytest.approx(ref["est"][i], abs=1e-6)
        assert ours[f"{eff}_se"] == pytest.approx(ref["se"][i], abs=1e-6)
        # lmerTest differentiates numerically (ours analytically); at a singular fit its df is n - 6
        assert ours[f"{eff}_df"] == pytest.approx(ref["df"][i], rel=1e-5)
        assert ours[f"{eff}_ci_low"] == pytest.approx(ref["lo"][i], abs=1e-6)
        assert ours[f"{eff}_ci_high"] == pytest.approx(ref["hi"][i], abs=1e-6)
        assert ours[f"{eff}_p"] == pytest.approx(ref["p"][i], rel=1e-5)
    assert ours["chi2_interaction"] == pytest.approx(ref["chi2"], rel=1e-6)


def test_rq1_mixed_model_recovers_a_planted_pull_toward_the_stereotype():
    # drift d toward the stereotype for both voices: per content step d, misaligned - neutral d
    d = deltas(drift=0.4, seed=21, noise=0.2)
    null = rq1_mixed_models(deltas(drift=0.0, seed=22, noise=0.2))
    res = rq1_mixed_models(d)
    for eff in ("stereotype_effect", "misaligned_minus_neutral"):
        # five fits: each within 3.5 SE of the planted value (a miss has probability ~5e-4 per fit)
        assert (np.abs(res[f"{eff}_est"] - 0.4) < 3.5 * res[f"{eff}_se"]).all()
        assert (res[f"{eff}_p"] < 1e-4).all()
        assert (np.abs(null[f"{eff}_est"]) < 3.5 * null[f"{eff}_se"]).all()
        assert (res[f"{eff}_ci_low"] < res[f"{eff}_est"]).all() and (res[f"{eff}_est"] < res[f"{eff}_ci_high"]).all()
    # the omnibus interaction cannot see a pull shared by both voices
    assert (res["p_interaction"] > 0.001).all()


def test_rq1_contrasts_match_welch_t_test_and_cohens_d():
    d = deltas(drift=0.1, seed=5, noise=0.3)
    ours = rq1_contrasts(d).set_index(["lang", "task", "voice_gender"]).loc[("es", "paraphrase", "female")]
    g = d[(d["lang"] == "es") & (d["task"] == "paraphrase") & (d["voice_gender"] == "female")]
    ref = run_r(
        """
mis <- d$delta_composite[d$pole == "masculine"]; neu <- d$delta_composite[d$pole == "neutral"]
t <- t.test(mis, neu, var.equal = FALSE)
sp <- sqrt(((length(mis) - 1) * var(mis) + (length(neu) - 1) * var(neu)) / (length(mis) + length(neu) - 2))
emit("t", t$statistic); emit("p", t$p.value); emit("d", (mean(mis) - mean(neu)) / sp)
""",
        d=g[["pole", "delta_composite"]],
    )
    assert ours["t"] == pytest.approx(ref["t"], rel=1e-9)
    assert ours["p_value"] == pytest.approx(ref["p"], rel=1e-8)
    assert ours["cohens_d"] == pytest.approx(ref["d"], rel=1e-9)


def test_rq1_pooled_matches_r_welch_satterthwaite():
    """Per language the two voices' signed contrasts average to (F_m - M_f + N_f - N_m) / 2: the male
    voice on feminine passages, the female voice on masculine ones, and the within-passage voice
    difference on neutral passages (the passage, voiced by both, is the independent unit)."""
    d = deltas(drift=0.2, seed=8, noise=0.3)
    ours = rq1_pooled(d).set_index("task_group").loc["same-language"]
    ref = run_r(
        """
d <- d[d$task != "translate", ]
pp <- aggregate(delta_composite ~ lang + voice_gender + pole + passage_id, data = d, FUN = mean)
est <- c(); v <- c(); parts <- list()
for (lang in unique(pp$lang)) {
  c <- pp[pp$lang == lang, ]
  fm <- c$delta_composite[c$pole == "feminine" & c$voice_gender == "male"]
  mf <- c$delta_composite[c$pole == "masculine" & c$voice_gender == "female"]
  n <- reshape(c[c$pole == "neutral", c("passage_id", "voice_gender", "delta_composite")], direction = "wide",
               idvar = "passage_id", timevar = "voice_gender")
  dn <- n$delta_composite.female - n$delta_composite.male
  est <- c(est, (mean(fm) - mean(mf) + mean(dn)) / 2)
  comp <- c(var(fm) / length(fm), var(mf) / length(mf), var(dn) / length(dn)) / 4
  v <- c(v, sum(comp))
  for (j in 1:3) parts[[length(parts) + 1]] <- c(comp[j], c(length(fm), length(mf), length(dn))[j] - 1)
}
k <- length(est); e <- mean(est); var <- sum(v) / k^2
df <- var^2 / sum(sapply(parts, function(x) (x[1] / k^2)^2 / x[2]))
emit("est", e); emit("se", sqrt(var)); emit("df", df)
emit("lo", e - qt(0.975, df) * sqrt(var)); emit("hi", e + qt(0.975, df) * sqrt(var))
emit("p", 2 * pt(-abs(e / sqrt(var)), df))
""",
        d=d[["lang", "task", "voice_gender", "pole", "passage_id", "delta_composite"]],
    )
    assert ours["pooled_contrast"] == pytest.approx(ref["est"], rel=1e-10)
    assert ours["se"] == pytest.approx(ref["se"], rel=1e-10)
    assert ours["df"] == pytest.approx(ref["df"], rel=1e-10)
    assert ours["ci_low"] == pytest.approx(ref["lo"], rel=1e-9) and ours["ci_high"] == pytest.approx(
        ref["hi"], rel=1e-9
    )
    assert ours["p_value"] == pytest.approx(ref["p"], rel=1e-8)


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (57, 60), (10, 10)])
def test_wilson_interval_matches_prop_test(k, n):
    ref = run_r(f"ci <- prop.test({k}, {n}, correct = FALSE)$conf.int; emit('lo', ci[1]); emit('hi', ci[2])")
    lo, hi = wilson(k, n)
    assert lo == pytest.approx(ref["lo"], abs=1e-7) and hi == pytest.approx(ref["hi"], abs=1e-7)


@pytest.mark.parametrize(
    "name,counts",
    [
        ("none", {(p, v): (3, 7) if v == "male" else (6, 4) for p in POLES for v in ("male", "female")}),
        ("complete", {(p, v): ((10, 0) if v == "female" else (0, 10)) for p in POLES for v in ("male", "female")}),
        (
            "quasi-complete",
            {
                **{("masculine", v): (0, 10) for v in ("male", "female")},
                **{("neutral", v): (5, 5) for v in ("male", "female")},
                **{("feminine", v): (10, 0) for v in ("male", "female")},
            },
        ),
    ],
)
def test_separation_class_matches_the_divergence_of_rs_glm(name, counts):
    # Albert & Anderson (1984): under separation the ML iterations diverge; with complete separation every
    # fitted probability goes to 0 or 1, with quasi-complete separation only some do.
    from voicebias.analysis.stats import detect_separation

    d = describe_design(table(counts))
    X = sm.add_constant(d[["content_step", "voice_female"]].to_numpy(), has_constant="add")
    ref = run_r(
        """
fit <- suppressWarnings(glm(y ~ content_step + voice_female, family = binomial, data = d,
                            control = list(epsilon = 1e-14, maxit = 200)))
p <- fitted(fit); at_bound <- p < 1e-8 | p > 1 - 1e-8
emit("max_abs_coef", max(abs(coef(fit)))); emit("share_at_bound", mean(at_bound))
""",
        d=d[["content_step", "voice_female", "y"]],
    )
    r_class = "none" if ref["max_abs_coef"] < 10 else "complete" if ref["share_at_bound"] == 1 else "quasi-complete"
    assert detect_separation(X, d["y"].to_numpy()) == r_class == name


def test_misgender_rates_match_r_counts():
    p = {
        (pole, v): 0.2 + 0.3 * i if v == "male" else 0.9 - 0.25 * i
        for i, pole in enumerate(POLES)
        for v in ("male", "female")
    }
    df = describe_rows(9, p)
    df.loc[df.index[::7], "judged_gender"] = "none"
    ours = misgender_rates(df, by_voice=True).set_index(["lang", "voice_gender", "cell_type"])
    ref = run_r(
        """
d$cell <- ifelse(d$pole == "neutral", "neutral", ifelse((d$pole == "feminine") == (d$voice_gender == "female"),
                 "aligned", "misaligned"))
d <- d[d$judged_gender %in% c("male", "female"), ]
d$wrong <- d$judged_gender != d$voice_gender
a <- aggregate(wrong ~ lang + voice_gender + cell, data = d, FUN = function(w) c(sum(w), length(w)))
a <- a[order(a$lang, a$voice_gender, a$cell), ]
emit("k", a$wrong[, 1]); emit("n", a$wrong[, 2])
""",
        d=df,
    )
    keys = sorted(
        (lang, v, c) for lang in ("en", "zh") for v in ("male", "female") for c in ("aligned", "misaligned", "neutral")
    )
    assert [int(ours.loc[k, "misgendered"]) for k in keys] == [int(x) for x in ref["k"]]
    assert [int(ours.loc[k, "n"]) for k in keys] == [int(x) for x in ref["n"]]


def test_summarize_pronouns_match_r():
    from voicebias.analysis.s2s import summarize_pronouns

    rng = np.random.default_rng(12)
    rows = []
    for lang in ("en", "es", "zh"):
        for pole in POLES:
            for voice in ("male", "female"):
                p = {"masculine": 0.2, "neutral": 0.5, "feminine": 0.8}[pole]
                for i in range(12):
                    u = rng.random()
                    choice = "none" if u < 0.1 else "both" if u < 0.15 else ("female" if rng.random() < p else "male")
                    rows.append(
                        {
                            "system": "s",
                            "task": "summarize",
                            "status": "ok",
                            "lang": lang,
                            "pole": pole,
                            "voice_gender": voice,
                            "pronoun_choice": choice,
                            "stimulus_id": f"{lang}{pole}{voice}{i}",
                        }
                    )
    df = pd.DataFrame(rows)
    ours = summarize_pronouns(df).iloc[0]
    ref = run_r(
        """
inj <- d$pronoun_choice %in% c("male", "female", "both")
one <- d[d$pronoun_choice %in% c("male", "female"), ]
cell <- aggregate(she ~ pole + voice_gender + lang, data = transform(one, she = pronoun_choice == "female"), FUN = mean)
byp <- tapply(cell$she, cell$pole, mean)
byv <- with(cell, tapply(she, list(voice_gender, pole), mean))
emit("rate", mean(inj)); emit("p_f", byp["feminine"]); emit("p_m", byp["masculine"])
emit("dpp", 100 * (byp["feminine"] - byp["masculine"]))
emit("dpp_male", 100 * (byv["male", "feminine"] - byv["male", "masculine"]))
emit("dpp_female", 100 * (byv["female", "feminine"] - byv["female", "masculine"]))
""",
        d=df[["lang", "pole", "voice_gender", "pronoun_choice"]],
    )
    assert ours["injection_rate"] == pytest.approx(ref["rate"], rel=1e-12)
    assert ours["p_she_feminine"] == pytest.approx(ref["p_f"], rel=1e-12)
    assert ours["p_she_masculine"] == pytest.approx(ref["p_m"], rel=1e-12)
    assert ours["delta_pp"] == pytest.approx(ref["dpp"], rel=1e-12)
    assert ours["delta_pp_male_voice"] == pytest.approx(ref["dpp_male"], rel=1e-12)
    assert ours["delta_pp_female_voice"] == pytest.approx(ref["dpp_female"], rel=1e-12)


# Koopman's score interval in R, written from its definition: the maximum-likelihood p2 under
# H0 p1 = theta p2 by optimize() on the log likelihood (not the closed-form root voicebias uses),
# Pearson's statistic with those proportions, and its z^2 crossings by uniroot() on log theta.
KOOPMAN_R = r"""
koopman <- function(x1, n1, x2, n2, conf = 0.95) {
  z2 <- qchisq(conf, 1)
  stat <- function(lth) {
    th <- exp(lth)
    ll <- function(p2) x1 * log(th * p2) + (n1 - x1) * log1p(-th * p2) + x2 * log(p2) + (n2 - x2) * log1p(-p2)
    p2 <- optimize(ll, c(1e-12, min(1, 1 / th) - 1e-12), maximum = TRUE, tol = 1e-14)$maximum
    p1 <- th * p2
    (x1 / n1 - th * x2 / n2)^2 / (p1 * (1 - p1) / n1 + th^2 * p2 * (1 - p2) / n2)
  }
  est <- log((x1 / n1) / (x2 / n2))
  lo <- uniroot(function(l) stat(l) - z2, c(est - 20, est), tol = 1e-13)$root
  hi <- uniroot(function(l) stat(l) - z2, c(est, est + 20), tol = 1e-13)$root
  exp(c(lo, hi))
}
"""


@pytest.mark.parametrize(
    "x1,n1,x2,n2", [(36, 40, 16, 80), (7, 10, 3, 10), (3, 30, 12, 30), (15, 20, 1, 20), (2.5, 10, 3, 10)]
)
def test_koopman_ratio_interval_matches_r(x1, n1, x2, n2):
    from voicebias.analysis.intervals import koopman_ratio

    ref = run_r(KOOPMAN_R + f"ci <- koopman({x1}, {n1}, {x2}, {n2}); emit('lo', ci[1]); emit('hi', ci[2])")
    _, lo, hi = koopman_ratio(x1, n1, x2, n2)
    assert lo == pytest.approx(ref["lo"], rel=1e-6) and hi == pytest.approx(ref["hi"], rel=1e-6)


def test_exact_coverage_of_the_wilson_interval_matches_r():
    from voicebias.analysis.disaggregated import rate_coverage

    got = rate_coverage(rates=(0.1, 0.8), sizes=(10, 30)).query("quantity == 'rate'").set_index(["rate", "n"])
    ref = run_r(
        "cov <- function(p, n) { k <- 0:n; ok <- sapply(k, function(x) {\n"
        "  ci <- prop.test(x, n, correct = FALSE)$conf.int; ci[1] <= p && p <= ci[2] })\n"
        "  sum(dbinom(k, n, p)[ok]) }\n"
        "emit('c', c(cov(0.1, 10), cov(0.1, 30), cov(0.8, 10), cov(0.8, 30)))"
    )
    want = dict(zip([(0.1, 10), (0.1, 30), (0.8, 10), (0.8, 30)], ref["c"]))
    for key, value in want.items():
        assert got.loc[key, "coverage"] == pytest.approx(value, abs=1e-12), key
