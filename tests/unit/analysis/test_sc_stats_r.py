"""SC statistics pinned to R computed at test time on the same tables (tests/support/rref.py).

lme4/lmerTest for the REML mixed model (fixed effects, SEs, variance components,
type-III F with Satterthwaite df), emmeans for the contrasts, R's ptukey / pt and a
quadrature written in R for Tukey p-values, a beta log-likelihood maximised with
optim for the beta regression. A missing R fails these tests.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf

from tests.support.rref import run_r
from tests.support.sc_design import simulate_vq
from voicebias.analysis.emm import emm_pairwise, studentized_range_sf, tukey_p_value
from voicebias.analysis.mixed import fit_reml, type3_f_tests
from voicebias.analysis.sc_stats import beta_regression_stepwise, continuation_differences, voice_quality_models

VOICES = {"f1": "female", "f2": "female", "m1": "male", "m2": "male"}
PHON = ["breathy", "creaky", "endcreak", "modal"]

LMER = r"""
suppressMessages(library(lmerTest))
options(contrasts = c("contr.sum", "contr.poly"))
for (f in c("system", "voice_gender", "phonation")) d[[f]] <- factor(d[[f]], levels = sort(unique(d[[f]])))
ctl <- lmerControl(optimizer = "nloptwrap", optCtrl = list(ftol_abs = 1e-14, xtol_abs = 1e-12))
m <- lmer(d ~ system * voice_gender * phonation + (1 | voice_id) + (1 | voice_id:phonation) + (1 | voice_id:system),
          data = d, REML = TRUE, control = ctl)
"""


def voice_cells(n_systems: int = 3, seed: int = 1) -> pd.DataFrame:
    """Voice x system x condition cells with every variance component well away from 0."""
    rng = np.random.default_rng(seed)
    systems = [f"s{k}" for k in range(n_systems)]
    v = {x: rng.normal(0, 0.8) for x in VOICES}
    vp = {(x, p): rng.normal(0, 0.5) for x in VOICES for p in PHON}
    vs = {(x, s): rng.normal(0, 0.6) for x in VOICES for s in systems}
    rows = []
    for (x, g), s, (i, p) in itertools.product(VOICES.items(), systems, enumerate(PHON)):
        rows.append(
            {
                "system": s,
                "voice_id": x,
                "voice_gender": g,
                "phonation": p,
                "d": 0.5 * i * (g == "female")
                - 0.3 * (s == "s1")
                + v[x]
                + vp[(x, p)]
                + vs[(x, s)]
                + rng.normal(0, 0.4),
            }
        )
    return pd.DataFrame(rows)


def _fit(cells: pd.DataFrame):
    return fit_reml(
        "d ~ C(system, Sum) * C(voice_gender, Sum) * C(phonation, Sum)",
        cells,
        {
            "voice": cells["voice_id"],
            "voice:phonation": cells["voice_id"] + ":" + cells["phonation"],
            "voice:system": cells["voice_id"] + ":" + cells["system"],
        },
    )


def test_reml_fit_matches_lme4_and_lmertest():
    cells = voice_cells()
    fit = _fit(cells)
    r = run_r(
        LMER
        + r"""
emit("beta", fixef(m)); emit("se", sqrt(diag(as.matrix(vcov(m)))))
vc <- as.data.frame(VarCorr(m)); emit("vc", vc$vcov[match(c("voice_id", "voice_id:phonation", "voice_id:system",
                                                           "Residual"), vc$grp)])
a <- anova(m, type = 3, ddf = "Satterthwaite"); emit("F", a[["F value"]]); emit("ddf", a$DenDF)
emit("reml", -as.numeric(REMLcrit(m)) / 2)
""",
        d=cells,
    )
    assert fit.params.to_numpy() == pytest.approx(np.array(r["beta"]), abs=1e-6)
    assert fit.bse.to_numpy() == pytest.approx(np.array(r["se"]), rel=1e-4)
    assert fit.vcomp.to_numpy() == pytest.approx(np.array(r["vc"]), rel=1e-4)
    assert fit.llf == pytest.approx(r["reml"], abs=1e-6)
    t3 = type3_f_tests(fit, min_df=0)
    t3 = t3[t3["term"] != "Intercept"]
    assert t3["f_value"].to_numpy() == pytest.approx(np.array(r["F"]), rel=1e-4)
    assert t3["den_df"].to_numpy() == pytest.approx(np.array(r["ddf"]), rel=1e-4)
    assert fit.converged


def test_voice_quality_tables_match_lmertest_and_emmeans_on_the_cell_table():
    """voice_quality_models end to end: its cell table refitted by lmer; type-III F and df
    vs lmerTest, contrasts (continuation - prompt and system pairs) vs emmeans with
    Satterthwaite df, Tukey over prompt + 2 systems vs R's ptukey on emmeans' t and df."""
    vq = simulate_vq(2, prompts=12, seed=4, voice_shift_sd=0.5, noise=0.8)
    rng = np.random.default_rng(9)
    vp = {(v, p): rng.normal(0, 0.6) for v in VOICES for p in PHON}
    cont = vq["source"] == "continuation"
    vq.loc[cont, "h1_h2_db"] += [vp[(v, p)] for v, p in zip(vq.loc[cont, "voice_id"], vq.loc[cont, "phonation"])]
    res = voice_quality_models(vq, measures=["h1_h2_db"], min_df=0)
    cells = continuation_differences(vq, "h1_h2_db")
    assert len(cells) == 4 * 2 * 4 and (cells["n"] == 12).all()
    # every component positive, so lme4's bounded fit and the unbounded one coincide
    vc = res["fits"].set_index("model").loc["continuation - prompt", "variance_components"]
    assert all(float(x.split("=")[1]) > 0.01 for x in vc.split("; "))
    r = run_r(
        LMER
        + r"""
a <- anova(m, type = 3, ddf = "Satterthwaite"); emit("F", a[["F value"]]); emit("ddf", a$DenDF)
suppressMessages(library(emmeans))
e <- as.data.frame(summary(emmeans(m, ~ system | voice_gender * phonation, lmer.df = "satterthwaite")))
e <- e[order(e$voice_gender, e$phonation, e$system), ]
emit("emm", e$emmean); emit("emm_se", e$SE); emit("emm_df", e$df)
emit("emm_p", ptukey(abs(e$emmean / e$SE) * sqrt(2), 3, e$df, lower.tail = FALSE))
pr <- as.data.frame(pairs(emmeans(m, ~ system | voice_gender * phonation, lmer.df = "satterthwaite"), adjust = "none"))
pr <- pr[order(pr$voice_gender, pr$phonation), ]
emit("pair", pr$estimate); emit("pair_se", pr$SE); emit("pair_df", pr$df)
emit("pair_p", ptukey(abs(pr$t.ratio) * sqrt(2), 3, pr$df, lower.tail = FALSE))
""",
        d=cells,
    )
    t3 = res["type3"]
    t3 = t3[(t3["model"] == "continuation - prompt") & (t3["term"] != "source")]
    assert t3["f_value"].to_numpy() == pytest.approx(np.array(r["F"]), rel=1e-4)
    assert t3["den_df"].to_numpy() == pytest.approx(np.array(r["ddf"]), rel=1e-4)
    c = res["contrasts"].sort_values(["voice_gender", "phonation", "level_a"])
    vs_prompt = c[c["level_b"] == "prompt"]
    assert vs_prompt["estimate"].to_numpy() == pytest.approx(np.array(r["emm"]), abs=1e-6)
    assert vs_prompt["se"].to_numpy() == pytest.approx(np.array(r["emm_se"]), rel=1e-4)
    assert vs_prompt["df"].to_numpy() == pytest.approx(np.array(r["emm_df"]), rel=1e-4)
    assert vs_prompt["p_tukey"].to_numpy() == pytest.approx(np.array(r["emm_p"]), rel=1e-4, abs=1e-7)
    pairs = c[c["level_b"] != "prompt"]
    assert pairs["estimate"].to_numpy() == pytest.approx(np.array(r["pair"]), abs=1e-6)
    assert pairs["se"].to_numpy() == pytest.approx(np.array(r["pair_se"]), rel=1e-4)
    assert pairs["df"].to_numpy() == pytest.approx(np.array(r["pair_df"]), rel=1e-4)
    assert pairs["p_tukey"].to_numpy() == pytest.approx(np.array(r["pair_p"]), rel=1e-4, abs=1e-7)


def test_prompt_model_matches_lmertest():
    """The prompts' own terms: cell means over prompts, y ~ voice_gender * phonation + (1 | voice)."""
    vq = simulate_vq(1, prompts=10, seed=6)
    res = voice_quality_models(vq, measures=["h1_h2_db"], min_df=0)
    t3 = res["type3"][res["type3"]["model"] == "prompt"]
    cells = (
        vq[vq["source"] == "prompt"]
        .groupby(["voice_id", "voice_gender", "phonation"], as_index=False)["h1_h2_db"]
        .mean()
    )
    r = run_r(
        r"""
suppressMessages(library(lmerTest))
options(contrasts = c("contr.sum", "contr.poly"))
m <- lmer(h1_h2_db ~ voice_gender * phonation + (1 | voice_id), data = p, REML = TRUE)
stopifnot(as.data.frame(VarCorr(m))$vcov[1] > 0)
a <- anova(m, type = 3, ddf = "Satterthwaite"); emit("F", a[["F value"]]); emit("ddf", a$DenDF)
""",
        p=cells,
    )
    assert t3["f_value"].to_numpy() == pytest.approx(np.array(r["F"]), rel=1e-4)
    assert t3["den_df"].to_numpy() == pytest.approx(np.array(r["ddf"]), rel=1e-4)


def test_untestable_terms_carry_no_p_value():
    res = voice_quality_models(simulate_vq(1, prompts=10, seed=4, voice_shift_sd=0.5), measures=["h1_h2_db"])
    t3 = res["type3"].set_index(["model", "term"])
    row = t3.loc[("prompt", "voice_gender")]
    assert not row["testable"] and np.isnan(row["p_value"]) and "2 voices per gender" in row["note"]
    assert row["den_df"] == pytest.approx(2.0, abs=0.05)
    inter = t3.loc[("continuation - prompt", "source:voice_gender:phonation")]
    assert inter["testable"] and inter["den_df"] == pytest.approx(6.0, abs=0.05) and 0 <= inter["p_value"] <= 1


def test_studentized_range_tail_matches_r():
    """Moderate tails vs ptukey; k = 2 tails of any size vs 2 * pt (exact); k > 2 tails far
    beyond ptukey's floor vs the range integral done in R with its own quadrature."""
    grid = [(3.5, 3, 10.0), (4.2, 4, 20.0), (5.0, 5, 6.5), (2.0, 3, 100.0), (6.5, 4, 40.0), (3.0, 6, 3.3)]
    tails = [
        (60.0, 2, 8.0),
        (40.0, 2, 30.0),
        (18.0, 2, np.inf),
        (9.0, 3, np.inf),
        (11.0, 4, np.inf),
        (12.0, 3, 60.0),
        (14.0, 4, 25.0),
    ]
    qs = pd.DataFrame(grid, columns=["q", "k", "df"])
    tt = pd.DataFrame(tails, columns=["q", "k", "df"]).assign(df=lambda x: x["df"].replace(np.inf, -1))
    r = run_r(
        r"""
emit("ptukey", ptukey(qs$q, qs$k, qs$df, lower.tail = FALSE))
range_sf <- function(q, k) {
  f <- function(x) { a <- pnorm(x, log.p = TRUE); b <- pnorm(x - q, log.p = TRUE)
    k * exp(dnorm(x, log = TRUE) + (k - 1) * a + log(-expm1((k - 1) * log1p(-exp(b - a))))) }
  integrate(f, q / 2 - 12, q / 2 + 12, rel.tol = 1e-12, abs.tol = 0)$value }
tail <- function(q, k, df) {
  if (k == 2) return(if (df < 0) 2 * pnorm(-q / sqrt(2)) else 2 * pt(-q / sqrt(2), df))
  if (df < 0) return(range_sf(q, k))
  g <- function(s) sapply(s, function(si) range_sf(q * si, k)) *
    exp(log(2) + (df / 2) * log(df / 2) - lgamma(df / 2) + (df - 1) * log(s) - df * s^2 / 2)
  integrate(g, 0, 3, rel.tol = 1e-10, abs.tol = 0)$value }
emit("tail", mapply(tail, tt$q, tt$k, tt$df))
""",
        qs=qs,
        tt=tt,
    )
    ours = [studentized_range_sf(q, k, df) for q, k, df in grid]
    assert ours == pytest.approx(r["ptukey"], rel=1e-6)
    tail_ours = [studentized_range_sf(q, k, df) for q, k, df in tails]
    assert all(0 < p < 1e-8 for p in tail_ours)
    assert tail_ours == pytest.approx(r["tail"], rel=1e-6)


def test_tukey_contrasts_match_emmeans_including_tiny_p():
    rng = np.random.default_rng(4)
    d = pd.DataFrame({"g": np.repeat(["w", "x", "y", "z"], 8)})
    d["y"] = rng.normal(size=len(d)) + d["g"].map({"w": 0, "x": 0.5, "y": 1.2, "z": 0.1})
    two = pd.DataFrame({"g": np.repeat(["a", "b"], 12)})
    two["y"] = rng.normal(0, 0.3, len(two)) + two["g"].map({"a": 0.0, "b": 6.0})
    r = run_r(
        r"""
suppressMessages(library(emmeans))
for (nm in c("d", "two")) { x <- get(nm); x$g <- factor(x$g); m <- lm(y ~ g, data = x)
  p <- as.data.frame(pairs(emmeans(m, ~ g), adjust = "tukey"))
  emit(paste0(nm, "_est"), p$estimate); emit(paste0(nm, "_se"), p$SE); emit(paste0(nm, "_p"), p$p.value) }
""",
        d=d,
        two=two,
    )
    for table, name in ((d, "d"), (two, "two")):
        fit = smf.ols("y ~ C(g, Sum)", table).fit()
        ours = emm_pairwise(fit, table, "g", df_resid=fit.df_resid)
        assert ours["estimate"].to_numpy() == pytest.approx(np.atleast_1d(r[f"{name}_est"]), abs=1e-9)
        assert ours["se"].to_numpy() == pytest.approx(np.atleast_1d(r[f"{name}_se"]), rel=1e-9)
        assert ours["p_tukey"].to_numpy() == pytest.approx(np.atleast_1d(r[f"{name}_p"]), rel=1e-5, abs=1e-9)
    tiny = emm_pairwise(smf.ols("y ~ C(g, Sum)", two).fit(), two, "g", df_resid=22)["p_tukey"].iloc[0]
    assert 0 < tiny < 1e-20 and tiny == pytest.approx(r["two_p"], rel=1e-6)
    assert tukey_p_value(50.0, 4, 30) > 0.0


def judged_table(seed: int = 11) -> pd.DataFrame:
    """Judge scores in (0, 1) with prompt-level dependence: prompts x voices x conditions."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(25):
        u = rng.normal(0, 0.3)
        for (v, g), c in itertools.product(VOICES.items(), ["modal", "breathy"]):
            eta = 0.2 + 0.3 * (g == "female") - 0.4 * (c == "breathy") + u
            mu = 1 / (1 + np.exp(-eta))
            rows.append(
                {
                    "prompt_id": f"p{p}",
                    "voice_id": v,
                    "voice_gender": g,
                    "phonation": c,
                    "y": rng.beta(mu * 15, (1 - mu) * 15),
                }
            )
    return pd.DataFrame(rows)


def test_beta_regression_matches_an_ml_fit_and_cluster_sandwich_in_r():
    d = judged_table()
    res = beta_regression_stepwise(
        d, "y", ["phonation", "voice_gender"], cluster="prompt_id", between_unit_factors=("voice_gender",)
    )
    coefs = res["coefficients"].set_index("term")
    assert list(res["kept_interactions"]["term"]) == ["phonation:voice_gender"]  # untestable: kept, not tested
    r = run_r(
        r"""
X <- cbind(1, ifelse(d$phonation == "breathy", 1, -1), ifelse(d$voice_gender == "female", 1, -1))
X <- cbind(X, X[, 2] * X[, 3]); y <- d$y
nll <- function(th) { b <- th[1:4]; phi <- exp(th[5]); mu <- plogis(X %*% b)
  -sum(lgamma(phi) - lgamma(mu * phi) - lgamma((1 - mu) * phi) + (mu * phi - 1) * log(y)
       + ((1 - mu) * phi - 1) * log(1 - y)) }
o <- optim(c(0, 0, 0, 0, 1), nll, method = "BFGS", control = list(reltol = 1e-14, maxit = 10000), hessian = TRUE)
th <- o$par; b <- th[1:4]; phi <- exp(th[5]); mu <- as.vector(plogis(X %*% b))
ys <- log(y / (1 - y)); ms <- digamma(mu * phi) - digamma((1 - mu) * phi)
s_b <- X * (phi * (ys - ms) * mu * (1 - mu))
s_g <- phi * (mu * (ys - ms) + log(1 - y) - digamma((1 - mu) * phi) + digamma(phi))
S <- cbind(s_b, s_g); G <- rowsum(S, d$prompt_id); n <- nrow(X); G_n <- nrow(G); K <- ncol(S)
bread <- solve(o$hessian); V <- bread %*% crossprod(G) %*% bread * G_n / (G_n - 1) * (n - 1) / (n - K)
emit("est", th); emit("se_cluster", sqrt(diag(V))); emit("se_model", sqrt(diag(bread))); emit("llf", -o$value)
""",
        d=d,
    )
    assert coefs["estimate"].to_numpy() == pytest.approx(np.array(r["est"]), abs=1e-5)
    assert coefs["se"].to_numpy() == pytest.approx(np.array(r["se_cluster"]), rel=1e-3)
    assert float(res["llf"]["llf"].iloc[0]) == pytest.approx(r["llf"], abs=1e-6)
    assert np.isnan(coefs.filter(like="voice_gender", axis=0)["p_value"]).all()
    phon = coefs.loc["C(phonation, Sum)[S.breathy]"]
    assert phon["testable"] and phon["p_value"] < 0.01
    # clustering matters here: the shared prompt effect widens the intercept's SE beyond the model-based one
    assert coefs.loc["Intercept", "se"] > 1.2 * r["se_model"][0]
