"""Binomial generalised linear mixed models with crossed random intercepts, fitted by Laplace.

`fit_binomial_glmm` maximises the Laplace approximation to the marginal likelihood of

    logit P(y_i = 1 | u) = x_i' beta + sum_j theta_j u_j[g_j(i)],   u_j ~ N(0, I),

jointly over the fixed effects beta and the random-intercept standard deviations theta
(theta_j >= 0): the criterion of lme4's `glmer` with its default nAGQ = 1 (Bates et al.,
2015, J. Stat. Softw. 67(1), sec. 5). For given (theta, beta) the conditional modes u come
from penalised iteratively reweighted least squares; the deviance is

    -2 log p(y | u) + |u|^2 + log det(Lambda' Z' W Z Lambda + I),

with W the binomial weights at the modes. The covariance of beta is twice the inverse of
the deviance's Hessian over (theta, beta), taken by central differences, the beta block:
what `vcov()` of a `glmer` fit reports by default.

Between-group terms are tested on the groups: `between_df` gives, for each fixed effect, the
number of levels of the coarsest grouping factor the term is constant within, less the number
of fixed effects constant within it (the "between-within" rule), so a voice-gender effect
with 3 voices per gender is tested on 4 degrees of freedom, not as if every answer were
another voice. See docs/analysis.md, "Describe: the mixed model".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import optimize, special, stats

from voicebias.analysis.status import NotEstimable
from voicebias.blas import single_blas_thread

#: step of the central differences for the Hessian (lme4's deriv12 default)
HESSIAN_STEP = 1e-4
#: a random-intercept SD beyond this (logit scale) means the Laplace approximation has broken
#: down (near-separation within the groups, e.g. two answers per passage that agree): no estimate
MAX_SD = 10.0


@dataclass
class GlmmFit:
    """A Laplace fit. `params`, `bse` (labelled Series), `cov` (DataFrame), `theta` (random
    intercept SDs on the logit scale, by grouping factor), `deviance` (the Laplace deviance,
    -2 log-likelihood, binomial constants included), `converged`, `boundary` (the factors whose
    SD is estimated at zero), `n_levels` and `between_df` (per fixed effect)."""

    params: pd.Series
    bse: pd.Series
    cov: pd.DataFrame
    theta: pd.Series
    deviance: float
    converged: bool
    boundary: list[str]
    n_levels: dict[str, int]
    between_df: pd.Series
    modes: dict[str, np.ndarray] = field(repr=False, default_factory=dict)

    def z(self) -> pd.Series:
        return self.params / self.bse

    def p_values(self, df: pd.Series | None = None) -> pd.Series:
        """Two-sided p-values: normal (glmer's z test) when `df` is None, else t on `df`."""
        z = self.z().to_numpy(float)
        if df is None:
            return pd.Series(2 * stats.norm.sf(np.abs(z)), index=self.params.index)
        d = df.reindex(self.params.index).to_numpy(float)
        p = np.where(np.isfinite(d) & (d > 0), 2 * stats.t.sf(np.abs(z), np.maximum(d, 1e-9)), np.nan)
        return pd.Series(p, index=self.params.index)


class _Problem:
    """The fixed pieces of one fit: design, indicator matrix, and the PIRLS warm start."""

    def __init__(self, y: np.ndarray, trials: np.ndarray, X: np.ndarray, codes: list[np.ndarray]) -> None:
        self.y, self.m, self.X = y, trials, X
        self.sizes = [int(c.max()) + 1 for c in codes]
        q = sum(self.sizes)
        Z = np.zeros((len(y), q))
        start = 0
        self.blocks = []
        for c, s in zip(codes, self.sizes):
            Z[np.arange(len(y)), start + c] = 1.0
            self.blocks.append(slice(start, start + s))
            start += s
        self.Z = Z
        self.u = np.zeros(q)
        # log binomial coefficients: constant in the parameters, part of -2 log L
        k = y * trials
        self.const = float(
            np.sum(special.gammaln(trials + 1) - special.gammaln(k + 1) - special.gammaln(trials - k + 1))
        )

    def lam(self, theta: np.ndarray) -> np.ndarray:
        return np.concatenate([np.full(s, t) for s, t in zip(self.sizes, theta)])

    def _loglik(self, eta: np.ndarray) -> float:
        # sum of m [y eta - log(1 + e^eta)] + constants, stable for large |eta|
        return float(np.sum(self.m * (self.y * eta - np.logaddexp(0.0, eta)))) + self.const

    def laplace(self, theta: np.ndarray, beta: np.ndarray, tol: float = 1e-12, max_iter: int = 100) -> float:
        """The Laplace deviance at (theta, beta); updates the warm-start modes."""
        lam = self.lam(theta)
        ZL = self.Z * lam
        off = self.X @ beta
        u = self.u.copy()

        def pen(u: np.ndarray) -> float:
            return -2 * self._loglik(off + ZL @ u) + float(u @ u)

        obj = pen(u)
        for _ in range(max_iter):
            eta = off + ZL @ u
            mu = special.expit(eta)
            w = self.m * mu * (1 - mu)
            grad = ZL.T @ (self.m * (self.y - mu)) - u
            H = (ZL.T * w) @ ZL + np.eye(len(u))
            step = np.linalg.solve(H, grad)
            t = 1.0
            while True:
                new = pen(u + t * step)
                if new <= obj + 1e-14 * max(1.0, abs(obj)) or t < 1e-10:
                    break
                t /= 2
            u = u + t * step
            done = obj - new < tol * max(1.0, abs(obj))
            obj = new
            if done:
                break
        eta = off + ZL @ u
        mu = special.expit(eta)
        w = self.m * mu * (1 - mu)
        H = (ZL.T * w) @ ZL + np.eye(len(u))
        sign, logdet = np.linalg.slogdet(H)
        self.u = u
        return obj + logdet


def _between_df(X: np.ndarray, names: list[str], codes: dict[str, np.ndarray]) -> pd.Series:
    """Degrees of freedom per fixed effect by the between-within rule (see the module docstring):
    a column constant within the levels of a grouping factor is tested on that factor's number of
    levels less the number of columns constant within it; a column that varies within every factor
    gets the residual df (observations less columns)."""
    n, p = X.shape
    out = {}
    const_within = {}
    for g, c in codes.items():
        cols = []
        for j in range(p):
            ok = all(np.ptp(X[c == lvl, j]) == 0 for lvl in np.unique(c))
            cols.append(ok)
        const_within[g] = np.array(cols)
    for j, name in enumerate(names):
        best = None
        for g, c in codes.items():
            if const_within[g][j]:
                df = len(np.unique(c)) - int(const_within[g].sum())
                best = df if best is None else min(best, df)
        out[name] = float(best) if best is not None else float(n - p)
    return pd.Series(out)


@single_blas_thread
def fit_binomial_glmm(
    y: np.ndarray,
    X: np.ndarray,
    names: list[str],
    groups: dict[str, np.ndarray],
    trials: np.ndarray | None = None,
) -> GlmmFit:
    """Laplace fit of a binomial GLMM (logit link) with crossed random intercepts.

    Parameters
    ----------
    y : array
        Share of successes per row (0/1 for one trial).
    X : array (n, p)
        Fixed-effect design, an intercept column included.
    names : list of str
        Labels of the columns of X.
    groups : dict
        Grouping factor name -> labels per row (any hashable values).
    trials : array, optional
        Trials per row (default 1).

    Raises NotEstimable when the design is rank-deficient, the outcome has one value only,
    or the optimiser finds no finite optimum.
    """
    y = np.asarray(y, float)
    X = np.asarray(X, float)
    m = np.ones_like(y) if trials is None else np.asarray(trials, float)
    if len(y) == 0:
        raise NotEstimable("no observations")
    if np.linalg.matrix_rank(X) < X.shape[1]:
        raise NotEstimable("the fixed-effect design is not of full rank")
    k = y * m
    if np.all(k == 0) or np.all(k == m):
        raise NotEstimable("every answer is the same: no log-odds can be estimated")
    codes = {g: pd.factorize(pd.Series(list(v)))[0].astype(int) for g, v in groups.items()}
    prob = _Problem(y, m, X, list(codes.values()))
    nt, p = len(codes), X.shape[1]

    # start: the GLM fit with small SDs
    glm = optimize.minimize(
        lambda b: -2 * prob._loglik(X @ b),
        np.zeros(p),
        jac=lambda b: -2 * X.T @ (m * (y - special.expit(X @ b))),
        method="BFGS",
        options={"gtol": 1e-10, "maxiter": 1000},
    )
    x0 = np.concatenate([np.full(nt, 0.5), glm.x])

    def f(x: np.ndarray) -> float:
        return prob.laplace(np.abs(x[:nt]), x[nt:])

    bounds = [(0.0, None)] * nt + [(None, None)] * p
    res = optimize.minimize(
        f, x0, method="L-BFGS-B", bounds=bounds, options={"ftol": 1e-15, "gtol": 1e-9, "maxiter": 2000}
    )
    best = res
    if not res.success:  # a derivative-free pass from the L-BFGS-B point when its line search gave up
        res2 = optimize.minimize(
            f, res.x, method="Powell", bounds=bounds, options={"xtol": 1e-10, "ftol": 1e-15, "maxiter": 20000}
        )
        best = res2 if res2.fun <= res.fun else res
    # The deviance is even in each SD, so SD = 0 is a stationary point the search can stop at
    # while a positive SD fits better: probe each SD found at zero at a few positive values, and
    # search again from a probe that lowers the deviance.
    for j in range(nt):
        if abs(best.x[j]) >= 1e-4 or not np.all(np.isfinite(best.x)):
            continue
        for start_sd in (0.1, 0.3, 1.0):
            x1 = best.x.copy()
            x1[j] = start_sd
            if not f(x1) < best.fun:
                continue
            again = optimize.minimize(
                f, x1, method="L-BFGS-B", bounds=bounds, options={"ftol": 1e-15, "gtol": 1e-9, "maxiter": 2000}
            )
            if np.isfinite(again.fun) and again.fun < best.fun - 1e-9:
                best = again
                break
    x = best.x.copy()
    if not np.all(np.isfinite(x)) or not np.isfinite(best.fun):
        raise NotEstimable("the Laplace fit found no finite optimum")
    theta, beta = x[:nt], x[nt:]
    if np.any(theta > MAX_SD):
        wide = ", ".join(f"{g} {t:.1f}" for g, t in zip(codes, theta) if t > MAX_SD)
        raise NotEstimable(
            f"a random-intercept SD diverged ({wide} on the logit scale, > {MAX_SD:g}): the Laplace "
            "approximation breaks down when the answers within each group (near-)separate"
        )
    dev = f(x)
    modes_u = prob.u.copy()

    # Hessian of the deviance over (theta, beta) by central differences; theta may step below
    # zero (the deviance is even in each theta), as lme4's deriv12 does.
    d = len(x)
    h = HESSIAN_STEP
    H = np.empty((d, d))

    def g(z: np.ndarray) -> float:
        prob.u = modes_u.copy()
        return prob.laplace(z[:nt], z[nt:])

    f0 = g(x)
    for i in range(d):
        ei = np.zeros(d)
        ei[i] = h
        H[i, i] = (g(x + ei) - 2 * f0 + g(x - ei)) / h**2
        for j in range(i + 1, d):
            ej = np.zeros(d)
            ej[j] = h
            H[i, j] = H[j, i] = (g(x + ei + ej) - g(x + ei - ej) - g(x - ei + ej) + g(x - ei - ej)) / (4 * h * h)
    try:
        V = 2 * np.linalg.inv(H)[nt:, nt:]
    except np.linalg.LinAlgError as exc:
        raise NotEstimable(f"the deviance's Hessian is singular: {exc}") from exc
    se = np.sqrt(np.diag(V)) if np.all(np.diag(V) > 0) else np.full(p, np.nan)
    if not np.all(np.isfinite(se)) or np.any(np.abs(beta) > 30):
        raise NotEstimable("the fixed effects have no finite standard errors (separation or a flat likelihood)")
    modes = {}
    for (gname, c), blk, t in zip(codes.items(), prob.blocks, theta):
        modes[gname] = t * modes_u[blk]
    return GlmmFit(
        params=pd.Series(beta, index=names),
        bse=pd.Series(se, index=names),
        cov=pd.DataFrame(V, index=names, columns=names),
        theta=pd.Series(theta, index=list(codes)),
        deviance=float(dev),
        converged=bool(best.success),
        boundary=[gname for gname, t in zip(codes, theta) if t < 1e-4],
        n_levels={gname: int(c.max()) + 1 for gname, c in codes.items()},
        between_df=_between_df(X, names, codes),
        modes=modes,
    )
