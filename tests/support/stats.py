"""Synthetic tables for the S2S statistics tests (describe counts, RQ1 deltas) and the far Firth profile in R."""

from __future__ import annotations

import numpy as np
import pandas as pd


def table(counts):
    """counts: {(pole, voice): (n_female, n_male)} -> describe rows."""
    rows = []
    for (pole, voice), (nf, nm) in counts.items():
        rows += [{"lang": "en", "pole": pole, "voice_gender": voice, "judged_gender": "female"}] * nf
        rows += [{"lang": "en", "pole": pole, "voice_gender": voice, "judged_gender": "male"}] * nm
    return pd.DataFrame(rows)


def deltas(drift=0.0, interaction=0.0, seed=0, passages=10, noise=0.2):
    """Delta table: fixed offset per voice, a passage effect, planted drift toward the stereotype."""
    rng = np.random.default_rng(seed)
    rows = []
    for lang in ("en", "es"):
        for pole in ("masculine", "neutral", "feminine"):
            for i in range(passages):
                pid = f"{lang}-{pole}-{i:02d}"
                u = rng.normal(0, 0.1)
                for voice in ("male", "female"):
                    shift = {"feminine": drift, "masculine": -drift, "neutral": 0.0}[pole]
                    extra = interaction if (voice == "male" and pole == "feminine") else 0.0
                    base = 1.5 if voice == "male" else -0.5
                    for task in ("readback", "paraphrase", "translate"):
                        if task == "translate" and lang == "en":
                            continue
                        rows.append(
                            {
                                "system": "s",
                                "lang": lang,
                                "task": task,
                                "pole": pole,
                                "voice_gender": voice,
                                "passage_id": pid,
                                "stimulus_id": f"{pid}-{voice}",
                                "status": "ok",
                                "delta_composite": base + shift + extra + u + rng.normal(0, noise),
                            }
                        )
    return pd.DataFrame(rows)


# The same profile written to hold far out on it: log(1 - p) and p (1 - p) from plogis of +-eta (no 1 - p
# cancellation), 0.5 log|X'WX| from the QR decomposition of W^1/2 X, optim's BFGS polished by Nelder-Mead from two
# starts, and each bound searched by doubling steps up to 1024 from the estimate (Inf when the profile does not
# cross the level there: an open side).
R_FIRTH_PROFILE_FAR = r"""
suppressMessages(library(brglm2))
# identical answers as one row weighted by their count (the likelihood and X'WX are sums over rows)
d <- aggregate(list(n = rep(1, nrow(d))), d[c("content_step", "voice_female", "y")], sum)
X <- cbind(1, d$content_step, d$voice_female); y <- d$y; n <- d$n
pl <- function(b) { eta <- drop(X %*% b)
  r <- abs(diag(qr.R(qr(X * sqrt(n * plogis(eta) * plogis(-eta))))))
  v <- sum(n * (y * eta + plogis(-eta, log.p = TRUE))) + sum(log(r)); if (is.finite(v)) v else -1e300 }
fit <- glm(y ~ content_step + voice_female, family = binomial, data = d, weights = n, method = "brglmFit",
           type = "AS_mean", control = list(epsilon = 1e-13, maxit = 1000))
bhat <- coef(fit); lmax <- pl(bhat)
prof <- function(v) max(sapply(list(c(0, 0), bhat[-2]), function(s) {
  o <- optim(s, function(a) -pl(c(a[1], v, a[2])), method = "BFGS", control = list(reltol = 1e-15, maxit = 10000))
  o <- optim(o$par, function(a) -pl(c(a[1], v, a[2])), method = "Nelder-Mead",
             control = list(reltol = 1e-15, maxit = 10000))
  -o$value }))
f <- function(v) 2 * (lmax - prof(v)) - qchisq(0.95, 1)
bound <- function(dir) { s <- 0.5
  while (s <= 1024 && f(bhat[2] + dir * s) <= 0) s <- 2 * s
  if (s > 1024) return(dir * Inf)
  uniroot(f, sort(c(bhat[2] + dir * (if (s > 0.5) s / 2 else 0), bhat[2] + dir * s)), tol = 1e-12)$root }
emit("coef", bhat[2]); emit("ci_low", bound(-1)); emit("ci_high", bound(1))
emit("p", pchisq(2 * (lmax - prof(0)), 1, lower.tail = FALSE))
"""


def mixed_table() -> pd.DataFrame:
    """One system x language x task with a planted stereotype pull, an interaction, a passage effect, unbalanced."""
    d = deltas(drift=0.3, interaction=0.2, seed=11, noise=0.3)
    g = d[(d["lang"] == "es") & (d["task"] == "readback")].copy()
    # passage effects large enough that the REML passage variance is interior
    pid = {p: i for i, p in enumerate(sorted(g["passage_id"].unique()))}
    g["delta_composite"] += np.array([0.25 * np.sin(3.0 * pid[p]) for p in g["passage_id"]])
    return g.drop(g.index[[0, 5, 17]])


def singular_table() -> pd.DataFrame:
    """Passage means removed: the REML passage variance is 0 (a singular fit in lme4 too)."""
    d = deltas(drift=0.2, seed=40, noise=0.3)
    g = d[(d["lang"] == "en") & (d["task"] == "readback")].copy()
    y = g["delta_composite"]
    g["delta_composite"] = (
        y - y.groupby(g["passage_id"]).transform("mean") + y.groupby([g["pole"], g["voice_gender"]]).transform("mean")
    )
    return g
