"""Linear mixed models with independent random intercepts, fitted by REML, and their F tests.

- `fit_reml`: REML with variance components (crossed or nested random intercepts), bounded as
  lme4 or released below 0 as SAS PROC MIXED's NOBOUND;
- `RemlFit.satterthwaite_df`, `f_test`, `type3_f_tests`: Satterthwaite degrees of freedom and
  Wald F tests with lmerTest's denominator df.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

import numpy as np
import pandas as pd
from scipy import stats
from scipy.linalg import solve_triangular

from voicebias.analysis.status import NotEstimable
from voicebias.blas import single_blas_thread


class RemlFit:
    """A REML fit of y = X beta + sum_j Z_j u_j + e with u_j ~ N(0, s2_j I), e ~ N(0, s2_e I).

    Attributes: `params` (fixed effects, labelled), `cov_params()` (their covariance
    (X' V^-1 X)^-1), `vcomp` (variance components, labelled; 'residual' last),
    `converged`, `llf` (REML log-likelihood), and the matrices needed for
    Satterthwaite degrees of freedom (`satterthwaite_df`).
    """

    def __init__(
        self,
        y: np.ndarray,
        X: np.ndarray,
        names: list[str],
        groups: dict[str, np.ndarray],
        gamma: np.ndarray,
        converged: bool,
        llf: float,
        term_columns: dict[str, list[int]],
    ) -> None:
        self.y, self.X, self.names, self.term_columns = y, X, names, term_columns
        self.codes = {name: np.asarray(c, int) for name, c in groups.items()}
        self.design = _Design(y, X, list(self.codes.values()))
        self.converged, self.llf = converged, llf
        n, p = X.shape
        D = self.design
        pt, ZtPZ, ZtPy, rss = D.projected(gamma)
        Ct = np.linalg.inv(pt["XtHiX"])
        beta = Ct @ pt["XtHiy"]
        s2 = float(rss) / (n - p)
        self.s2 = s2
        self.vcomp = pd.Series([s2 * g for g in gamma] + [s2], index=[*groups, "residual"], dtype=float)
        self._Ct, self._M, self._ZtPZ = Ct, pt["M"], ZtPZ
        # a component estimated at exactly 0 (a bounded, singular fit) is held at its boundary: in
        # lmerTest's parametrisation (SDs) the covariance of the fixed effects does not move with it
        # there, so it takes no part in the Satterthwaite df
        self._free_blocks = [b for b, g in zip(self.design.blocks, gamma) if g != 0]
        # B = H^-1 X, n x p
        self._B = X - D.Z @ (pt["M"] @ D.ZtX)
        self.C = s2 * Ct
        self.params = pd.Series(beta, index=names)
        self._vc_cov = self._variance_covariance()

    def cov_params(self) -> pd.DataFrame:
        """Covariance of the fixed effects, (X' V^-1 X)^-1 at the REML variance components."""
        return pd.DataFrame(self.C, index=self.names, columns=self.names)

    @property
    def bse(self) -> pd.Series:
        return pd.Series(np.sqrt(np.diag(self.C)), index=self.names)

    def _hinv(self, v: np.ndarray) -> np.ndarray:
        """H^-1 v (Woodbury)."""
        D = self.design
        return v - D.Z @ (self._M @ (D.Z.T @ v))

    def _p(self, v: np.ndarray) -> np.ndarray:
        """P v on the H scale, P = H^-1 - B (X'H^-1 X)^-1 B', B = H^-1 X."""
        return self._hinv(v) - self._B @ (self._Ct @ (self._B.T @ v))

    def _variance_covariance(self) -> np.ndarray:
        """Inverse observed REML information of the variance components (each random intercept,
        then the residual): I_ij = y' P V_i P V_j P y - tr(P V_i P V_j) / 2, P = V^-1 - V^-1 X C X' V^-1,
        with V_i = Z_i Z_i' (I for the residual), all by Woodbury on the random-effect columns."""
        D, s2 = self.design, self.s2
        blocks = self._free_blocks
        py = self._p(self.y) / s2  # P y on the V scale
        us = [D.Z[:, b] @ (D.Z[:, b].T @ py) for b in blocks] + [py]
        pus = [self._p(u) / s2 for u in us]
        m = len(us)
        PZ = self._p(D.Z)  # H-scale P Z, n x q
        # tr(P_H V_i P_H V_j) on the H scale, then / s2^2
        tr = np.empty((m, m))
        for i in range(m - 1):
            for j in range(i, m - 1):
                tr[i, j] = tr[j, i] = float(np.sum(self._ZtPZ[blocks[i], blocks[j]] ** 2))
            tr[i, m - 1] = tr[m - 1, i] = float(np.sum(PZ[:, blocks[i]] ** 2))
        M, ZtZ, B, Ct = self._M, D.ZtZ, self._B, self._Ct
        MZ = M @ ZtZ
        tr_h2 = D.n - 2 * float(np.trace(MZ)) + float(np.sum(MZ * MZ.T))
        BtHB = B.T @ self._hinv(B)
        CB = Ct @ (B.T @ B)
        tr[m - 1, m - 1] = tr_h2 - 2 * float(np.sum(Ct * BtHB.T)) + float(np.sum(CB * CB.T))
        tr /= s2**2
        info = np.empty((m, m))
        for i in range(m):
            for j in range(i, m):
                info[i, j] = info[j, i] = float(us[i] @ pus[j]) - 0.5 * tr[i, j]
        return np.linalg.pinv(info)

    def satterthwaite_df(self, contrast: np.ndarray) -> float:
        """Satterthwaite df of one contrast l'beta: 2 (l'Cl)^2 / (g' A g), g_i = d(l'Cl)/d s2_i
        = l'C X' V^-1 V_i V^-1 X C l, A the inverse observed REML information."""
        c = np.asarray(contrast, float)
        v = float(c @ self.C @ c)
        w = self._B @ (self._Ct @ c)  # V^-1 X C c
        zw = self.design.Z.T @ w
        g = np.array([float(zw[b] @ zw[b]) for b in self._free_blocks] + [float(w @ w)])
        denom = float(g @ self._vc_cov @ g)
        return float(2 * v * v / denom) if denom > 0 else float("nan")  # NaN: no df (degenerate information)


class _Design:
    """The pieces of y = X beta + Z u + e that REML needs, reduced to the random-effect columns
    (q = total levels): with H = I + Z diag(g) Z', Woodbury gives H^-1 = I - Z M Z' with
    M = diag(g) (I + Z'Z diag(g))^-1, so every quadratic form and log-determinant is a q x q
    computation, whatever the number of observations n."""

    def __init__(self, y: np.ndarray, X: np.ndarray, codes: list[np.ndarray]) -> None:
        self.y, self.X = y, X
        self.n, self.p = X.shape
        sizes = [int(np.max(c)) + 1 if len(c) else 0 for c in codes]
        q = int(sum(sizes))
        Z = np.zeros((self.n, q))
        start = 0
        self.blocks: list[slice] = []
        for c, s in zip(codes, sizes):
            Z[np.arange(self.n), start + np.asarray(c, int)] = 1.0
            self.blocks.append(slice(start, start + s))
            start += s
        self.Z = Z
        self.col_group = np.concatenate([np.full(s, j) for j, s in enumerate(sizes)]) if sizes else np.zeros(0, int)
        self.ZtZ = Z.T @ Z
        self.ZtX, self.Zty = Z.T @ X, Z.T @ y
        self.XtX, self.Xty, self.yty = X.T @ X, X.T @ y, float(y @ y)
        lam, U = np.linalg.eigh(self.ZtZ)
        self.R = np.sqrt(np.clip(lam, 0.0, None))[:, None] * U.T  # Z'Z = R'R
        #: the last `parts` computed, by its gamma: the optimiser asks for the deviance and its
        #: gradient at the same point, and each needs the same q x q factorisation
        self._last: tuple[bytes, dict | None] | None = None

    def parts(self, gamma: np.ndarray) -> dict | None:
        """M, the eigenvalues of R diag(g) R' (H's non-unit eigenvalues less 1) and the H^-1 forms;
        None where H is not positive definite."""
        key = np.asarray(gamma, float).tobytes()
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        out = self._parts(gamma)
        self._last = (key, out)
        return out

    def _parts(self, gamma: np.ndarray) -> dict | None:
        g = np.asarray(gamma, float)[self.col_group]
        q = len(g)
        if q and np.all(g >= 0):
            # H's non-unit eigenvalues less 1 are those of S = sqrt(g) Z'Z sqrt(g) >= 0: a Cholesky of I + S
            # gives log det H and M = sqrt(g) (I + S)^-1 sqrt(g)
            r = np.sqrt(g)
            try:
                L = np.linalg.cholesky(np.eye(q) + r[:, None] * self.ZtZ * r[None, :])
            except np.linalg.LinAlgError:
                return None
            # L^-1 diag(r) by forward substitution (L is lower triangular)
            Li = solve_triangular(L, np.eye(q), lower=True) * r[None, :]
            M = Li.T @ Li
            logdet = 2 * float(np.sum(np.log(np.diag(L))))
            ev = None
        else:
            ev = np.linalg.eigvalsh((self.R * g) @ self.R.T) if q else np.zeros(0)
            if q and ev.min() <= -1.0 + 1e-12:
                return None
            A = np.eye(q) + self.ZtZ * g[None, :]
            try:
                M = g[:, None] * np.linalg.solve(A, np.eye(q))
            except np.linalg.LinAlgError:
                return None
            M = (M + M.T) / 2
            logdet = float(np.sum(np.log1p(ev)))
        XtHiX = self.XtX - self.ZtX.T @ M @ self.ZtX
        XtHiy = self.Xty - self.ZtX.T @ M @ self.Zty
        ytHiy = self.yty - float(self.Zty @ M @ self.Zty)
        return {"M": M, "ev": ev, "logdet": logdet, "XtHiX": XtHiX, "XtHiy": XtHiy, "ytHiy": ytHiy}

    def cond(self, gamma: np.ndarray) -> float:
        """Condition number of H."""
        g = np.asarray(gamma, float)[self.col_group]
        ev = np.linalg.eigvalsh((self.R * g) @ self.R.T) if len(g) else np.zeros(0)
        e = np.concatenate([[1.0], 1.0 + ev])
        return float(e.max() / e.min()) if e.min() > 0 else float("inf")

    def projected(self, gamma: np.ndarray) -> tuple[dict, np.ndarray, np.ndarray, float]:
        """(parts, Z'PZ, Z'Py, y'Py) with P = H^-1 - H^-1 X (X'H^-1 X)^-1 X'H^-1."""
        pt = self.parts(gamma)
        M = pt["M"]
        ZtHiZ = self.ZtZ - self.ZtZ @ M @ self.ZtZ
        ZtHiX = self.ZtX - self.ZtZ @ M @ self.ZtX
        ZtHiy = self.Zty - self.ZtZ @ M @ self.Zty
        Ct = np.linalg.inv(pt["XtHiX"])
        beta = Ct @ pt["XtHiy"]
        ZtPZ = ZtHiZ - ZtHiX @ Ct @ ZtHiX.T
        ZtPy = ZtHiy - ZtHiX @ beta
        yPy = pt["ytHiy"] - float(pt["XtHiy"] @ beta)
        return pt, ZtPZ, ZtPy, yPy


def _reml_objective(gamma: np.ndarray, D: _Design) -> float:
    """REML deviance (up to a constant) in the variance ratios, residual variance profiled out:
    log det H + log det X'H^-1 X + (n - p) log(y'Py); 1e300 where H is not positive definite."""
    pt = D.parts(gamma)
    if pt is None:
        return 1e300
    sign, logdet_x = np.linalg.slogdet(pt["XtHiX"])
    if sign <= 0:
        return 1e300
    beta = np.linalg.solve(pt["XtHiX"], pt["XtHiy"])
    rss = pt["ytHiy"] - float(pt["XtHiy"] @ beta)
    if not rss > 0:
        return 1e300
    return pt["logdet"] + logdet_x + (D.n - D.p) * np.log(rss)


FREE_MARGIN = 1e-6
#: a bounded component whose removal raises the REML deviance by no more than this share of it is at
#: its boundary (rounding in the deviance is about 1e-15 of it; 1e-12 keeps a margin of a thousand)
BOUNDARY_MARGIN = 1e-12
# The REML optimum is located when the deviance's derivative in each log variance ratio is
# below this (a located optimum gives about 1e-6 or less; a search stopped on the way, 1e-2 and
# more). The decision looks at where the search ended, not at the optimiser's own stopping flag,
# whose line search stops on the last bits of a flat deviance and so flips between machines.
GRADIENT_TOL = 1e-3


def _at_optimum(gamma: np.ndarray, D: _Design, bounded: bool) -> bool:
    """The KKT conditions of the REML problem at gamma, by central differences in log gamma
    (forward differences in gamma at the bound gamma_j = 0, where the derivative must not be
    negative), to GRADIENT_TOL."""
    f0 = _reml_objective(gamma, D)
    if not np.isfinite(f0) or f0 >= 1e299:
        return False
    for j, g in enumerate(gamma):
        if bounded and g <= 1e-8:
            h = 1e-6
            up = gamma.copy()
            up[j] = g + h
            if (_reml_objective(up, D) - f0) / h < -GRADIENT_TOL:
                return False
            continue
        h = 1e-4 * max(abs(g), 1e-8)
        up, down = gamma.copy(), gamma.copy()
        up[j], down[j] = g + h, g - h
        d = (_reml_objective(up, D) - _reml_objective(down, D)) / (2 * h) * abs(g)
        if not np.isfinite(d) or abs(d) > GRADIENT_TOL:
            return False
    return True


def _reml_gradient(gamma: np.ndarray, D: _Design) -> np.ndarray:
    """Gradient of `_reml_objective` (see `_reml_derivatives`); zeros where H is not positive definite.

    Only the diagonal of Z'PZ enters (its trace over each block), so it is formed row by row from
    A = Z'Z M, one q x q product, not as the full matrix `_Design.projected` builds."""
    pt = D.parts(gamma)
    if pt is None:
        return np.zeros(len(gamma))
    A = D.ZtZ @ pt["M"]
    ZtHiX = D.ZtX - A @ D.ZtX
    ZtHiy = D.Zty - A @ D.Zty
    Ct = np.linalg.inv(pt["XtHiX"])
    beta = Ct @ pt["XtHiy"]
    # diag(Z'H^-1 Z) = diag(Z'Z) - rowsum(A * Z'Z) (Z'Z is symmetric); diag of Z'H^-1 X C X'H^-1 Z likewise
    diag = np.diag(D.ZtZ) - np.einsum("ij,ij->i", A, D.ZtZ) - np.einsum("ij,ij->i", ZtHiX @ Ct, ZtHiX)
    ZtPy = ZtHiy - ZtHiX @ beta
    q = pt["ytHiy"] - float(pt["XtHiy"] @ beta)
    a = np.array([float(ZtPy[b] @ ZtPy[b]) for b in D.blocks])
    return np.array([float(np.sum(diag[b])) for b in D.blocks]) - (D.n - D.p) * a / q


def _reml_derivatives(gamma: np.ndarray, D: _Design) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and Hessian of `_reml_objective` in the variance ratios, analytically:
    with H = I + sum_j gamma_j G_j, P = H^-1 - H^-1 X (X'H^-1 X)^-1 X'H^-1, q = y'Py,
    a_j = y'P G_j P y and b_jk = y'P G_j P G_k P y, the deviance's derivatives are
    g_j = tr(P G_j) - (n - p) a_j / q and
    H_jk = -tr(P G_j P G_k) + (n - p) (2 b_jk / q - a_j a_k / q^2); with G_j = Z_j Z_j' each is
    a form in Z'PZ and Z'Py."""
    _, ZtPZ, ZtPy, q = D.projected(gamma)
    r = D.n - D.p
    bl = D.blocks
    a = np.array([float(ZtPy[b] @ ZtPy[b]) for b in bl])
    grad = np.array([float(np.trace(ZtPZ[b, b])) for b in bl]) - r * a / q
    m = len(bl)
    hess = np.empty((m, m))
    for j in range(m):
        for k in range(j, m):
            blk = ZtPZ[bl[j], bl[k]]
            b = float(ZtPy[bl[j]] @ blk @ ZtPy[bl[k]])
            hess[j, k] = hess[k, j] = -float(np.sum(blk * blk)) + r * (2 * b / q - a[j] * a[k] / q**2)
    return grad, hess


def _polish(gamma: np.ndarray, D: _Design, bounded: bool) -> np.ndarray:
    """Newton steps from a located REML optimum with the analytic derivatives, over the components
    not held at the bound (gamma_j > 1e-8 when `bounded`), until the step is rounding: the optimiser
    stops where its tolerances let it, which differs between machines in the sixth digit; the
    polished optimum agrees to rounding. Returns `gamma` unchanged where a step would leave the
    region (a component below 0 under the bound, H not positive definite) or raise the deviance."""
    x = np.asarray(gamma, float).copy()
    free = np.array([not bounded or g > 1e-8 for g in x])
    if not free.any():
        return x
    f = _reml_objective(x, D)
    for _ in range(30):
        grad, hess = _reml_derivatives(x, D)
        try:
            step = -np.linalg.solve(hess[np.ix_(free, free)], grad[free])
        except np.linalg.LinAlgError:
            return x
        nxt = x.copy()
        nxt[free] += step
        if (bounded and np.any(nxt < 0)) or not np.all(np.isfinite(nxt)):
            return x
        f_next = _reml_objective(nxt, D)
        if f_next >= 1e299 or f_next > f + 1e-9 * max(1.0, abs(f)):
            return x
        x, f = nxt, f_next
        if np.all(np.abs(step) <= 1e-14 * np.maximum(1.0, np.abs(x[free]))):
            break
    return x


def fit_reml(formula: str, data: pd.DataFrame, groups: dict[str, Iterable[Any]], nobound: bool = True) -> RemlFit:
    """REML fit of a linear mixed model with independent random intercepts per grouping.

    The residual variance is profiled out and the variance ratios gamma_j = s2_j / s2_e
    are optimised, first with gamma_j >= 0 (L-BFGS-B from three starts, the lme4 fit),
    then without that bound (Nelder-Mead over the region where V is positive
    definite, SAS PROC MIXED's NOBOUND). Where every component is
    positive this is the lme4 / lmerTest fit; where one is estimated below 0 (less
    variation between units than within, as often under the null), the bounded fit
    would pool two error strata on that data-dependent event and its within-unit
    tests reject too often (about 7 % at alpha .05 on 4 voices), while the unbounded
    fit keeps them exact in balanced designs (the ANOVA F tests of each stratum). A
    negative component is reported as it is. Intended for the small tables of cell
    means used here (dense n x n algebra).

    Parameters
    ----------
    formula : str
        Patsy formula of the fixed effects (``y ~ C(a, Sum) * C(b, Sum)``).
    data : DataFrame
        One row per observation.
    groups : dict
        Name -> labels (one per row of data) of each random intercept; crossed or
        nested groupings are both allowed (lme4's ``(1 | g)`` for each).
    nobound : bool
        Whether a variance component may be estimated below 0 (True, as above); with False
        the fit is lme4's (see `fit_reml_matrices`).

    Returns
    -------
    RemlFit
        The fit: params (fixed effects), cov_params(), vcomp (variance components,
        'residual' last), converged, llf, term_columns and satterthwaite_df().

    Examples
    --------
    Four voices (two per gender) in two phonation conditions, one mean per cell:

    >>> import numpy as np
    >>> import pandas as pd
    >>> cells = pd.DataFrame({"voice_id": ["m1", "m1", "m2", "m2", "f1", "f1", "f2", "f2"],
    ...                       "voice_gender": ["male"] * 4 + ["female"] * 4,
    ...                       "phonation": ["modal", "breathy"] * 4,
    ...                       "y": [1.0, 3.1, 1.4, 3.3, 2.0, 4.6, 2.6, 4.8]})
    >>> fit = fit_reml("y ~ C(voice_gender, Sum) * C(phonation, Sum)", cells, {"voice": cells["voice_id"]})
    >>> fit.converged
    True
    >>> print(fit.params.round(3).to_string())
    Intercept                                                      2.85
    C(voice_gender, Sum)[S.female]                                 0.65
    C(phonation, Sum)[S.breathy]                                   1.10
    C(voice_gender, Sum)[S.female]:C(phonation, Sum)[S.breathy]    0.10
    >>> print(fit.vcomp.round(4).to_string())
    voice       0.050
    residual    0.025
    """
    from patsy import dmatrices

    y_m, X_m = dmatrices(formula, data, return_type="dataframe", NA_action="raise")
    X = X_m.to_numpy(float)
    if np.linalg.matrix_rank(X) < X.shape[1]:
        raise NotEstimable(f"the fixed-effects design of '{formula}' is rank deficient (empty cells?)")
    codes = {name: pd.factorize(pd.Series(list(g), index=data.index).astype(str))[0] for name, g in groups.items()}
    design = X_m.design_info
    term_columns = {}
    for term, sl in design.term_name_slices.items():
        if term != "Intercept":
            term_columns[term] = list(range(sl.start, sl.stop))
    fit = fit_reml_matrices(
        y_m.iloc[:, 0].to_numpy(float),
        X,
        list(X_m.columns),
        codes,
        {"Intercept": [0], **term_columns} if "Intercept" in X_m.columns else term_columns,
        nobound=nobound,
    )
    fit.design_info = design
    return fit


@single_blas_thread
def fit_reml_matrices(
    y: np.ndarray,
    X: np.ndarray,
    names: list[str],
    codes: dict[str, np.ndarray],
    term_columns: dict[str, list[int]] | None = None,
    nobound: bool = True,
) -> RemlFit:
    """`fit_reml` on a response vector, a full-rank fixed-effects design and integer group codes.

    With ``nobound=False`` the variance ratios stay at or above 0 (lme4's fit), and a component
    whose standard deviation is below 1e-4 of the residual one (lme4's ``isSingular``
    tolerance, voicebias.analysis.rounding) is set to exactly 0: a singular fit.

    Parameters
    ----------
    y : array of shape (n,)
        The response.
    X : array of shape (n, p)
        The fixed-effects design (full column rank).
    names : list of str
        The p fixed-effect names.
    codes : dict
        Name -> integer label per row of each random intercept.
    term_columns : dict, optional
        Term -> its columns of X, for `type3_f_tests` (default: one term per column).
    nobound : bool
        Whether a variance component may be estimated below 0 (see `fit_reml`).

    Returns
    -------
    RemlFit
        The fit.

    Examples
    --------
    Three passages each read in two conditions, one random intercept per passage:

    >>> import numpy as np
    >>> y = np.array([1.0, 2.1, 1.6, 2.4, 0.7, 2.0])
    >>> X = np.column_stack([np.ones(6), [0, 1] * 3])
    >>> fit = fit_reml_matrices(y, X, ["Intercept", "b"], {"passage": np.repeat([0, 1, 2], 2)}, nobound=False)
    >>> print(fit.params.round(4).to_string())
    Intercept    1.1000
    b            1.0667
    >>> print(fit.vcomp.round(4).to_string())
    passage     0.0950
    residual    0.0317
    """
    from scipy import optimize

    from voicebias.analysis.rounding import singular_ratio

    y, X = np.asarray(y, float), np.asarray(X, float)
    if X.shape[0] - X.shape[1] < 1:
        raise NotEstimable("no residual degrees of freedom: more fixed effects than observations")
    D = _Design(y, X, [np.asarray(c, int) for c in codes.values()])
    m = len(codes)
    best = None
    # first the bounded fit (gamma >= 0, as lme4), then released from the bound: Nelder-Mead over the whole
    # region where H = I + sum gamma_j G_j is positive definite (the objective refuses the rest)
    for start in (0.1, 1.0, 5.0):
        res = optimize.minimize(
            _reml_objective,
            np.full(m, start),
            args=(D,),
            jac=_reml_gradient,
            method="L-BFGS-B",
            bounds=[(0.0, None)] * m,
            options={"maxiter": 1000, "ftol": 1e-14, "gtol": 1e-10},
        )
        if best is None or res.fun < best.fun:
            best = res
    assert best is not None
    best = optimize.OptimizeResult(x=best.x, fun=best.fun, success=_at_optimum(best.x, D, bounded=True))
    if nobound:
        free = optimize.minimize(
            _reml_objective,
            best.x,
            args=(D,),
            method="Nelder-Mead",
            options={
                "xatol": 1e-10,
                "fatol": 1e-13,
                "maxiter": 4000 * max(m, 1),
                "initial_simplex": best.x + np.vstack([np.zeros(m), 0.05 * np.eye(m)]),
            },
        )
        # released from the bound only when that improves the REML deviance by a margin (1e-6), not by
        # rounding, and away from the edge of the region (V singular)
        if free.fun < best.fun - FREE_MARGIN:
            if D.cond(free.x) < 1e10:
                best = optimize.OptimizeResult(x=free.x, fun=free.fun, success=_at_optimum(free.x, D, bounded=False))
    # convergence is decided with its margin at the located point, or at the polished optimum when the
    # search stopped short on a flat deviance and Newton's steps reached the optimum from there; the
    # estimate is the polished optimum
    bounded = not np.any(best.x < 0)
    x = _polish(np.asarray(best.x, float), D, bounded=bounded)
    if not best.success and not np.array_equal(x, best.x):
        best = optimize.OptimizeResult(x=best.x, fun=best.fun, success=_at_optimum(x, D, bounded=bounded))
    if not nobound:
        # at the boundary (a singular fit): a standard deviation under lme4's isSingular tolerance, or a
        # component whose removal raises the REML deviance by rounding only (BOUNDARY_MARGIN of its size):
        # near the boundary the search and Newton's steps place it anywhere below about 1e-8 of the
        # residual variance, on the last bits of the data
        f_x = _reml_objective(x, D)
        for j, g in enumerate(x):
            zero = x.copy()
            zero[j] = 0.0
            if singular_ratio(g) or _reml_objective(zero, D) <= f_x + BOUNDARY_MARGIN * max(1.0, abs(f_x)):
                x = zero
                f_x = min(f_x, _reml_objective(x, D))
    fun = _reml_objective(x, D)
    n, p = X.shape
    llf = -0.5 * (fun + (n - p) * (1 + np.log(2 * np.pi / (n - p))))
    return RemlFit(
        y,
        X,
        list(names),
        codes,
        np.asarray(x, float),
        bool(best.success),
        float(llf),
        term_columns if term_columns is not None else {n_: [i] for i, n_ in enumerate(names)},
    )


def _fai_cornelius_df(nus: np.ndarray) -> float:
    """Denominator df of a q-df F from its q orthogonal 1-df Satterthwaite dfs (lmerTest's rule)."""
    if len(nus) == 1 or np.any(np.isnan(nus)):
        return float(nus[0]) if len(nus) == 1 else float("nan")
    if np.all(np.isinf(nus)):
        return float("inf")
    if np.all(np.isfinite(nus)) and np.all(np.abs(np.diff(nus)) < 1e-8):
        return float(np.mean(nus))
    if np.any(nus <= 2):
        return 2.0
    with np.errstate(invalid="ignore", divide="ignore"):
        e = float(np.sum(np.where(np.isinf(nus), 1.0, nus / (nus - 2))))
    return 2 * e / (e - len(nus)) if e > len(nus) else float("inf")


def f_test(fit: RemlFit, L: np.ndarray) -> dict[str, float]:
    """Wald F test of L beta = 0 with Satterthwaite denominator df (lmerTest's method).

    F = b' L' (L C L')^-1 L b / q. L C L' is split into q orthogonal 1-df contrasts
    (eigenvectors), each gets its Satterthwaite df, and these are combined as in
    Fai & Cornelius (1996): E = sum nu_m / (nu_m - 2), ddf = 2E / (E - q).

    Parameters
    ----------
    fit : RemlFit
        A `fit_reml` model.
    L : array of shape (q, p) or (p,)
        Rows of the hypothesis L beta = 0 over the p fixed effects.

    Returns
    -------
    dict
        f_value, num_df (q), den_df, p_value.

    Examples
    --------
    >>> import numpy as np
    >>> import pandas as pd
    >>> cells = pd.DataFrame({"voice_id": ["m1", "m1", "m2", "m2", "f1", "f1", "f2", "f2"],
    ...                       "voice_gender": ["male"] * 4 + ["female"] * 4,
    ...                       "phonation": ["modal", "breathy"] * 4,
    ...                       "y": [1.0, 3.1, 1.4, 3.3, 2.0, 4.6, 2.6, 4.8]})
    >>> fit = fit_reml("y ~ C(voice_gender, Sum) * C(phonation, Sum)", cells, {"voice": cells["voice_id"]})
    >>> {k: round(v, 3) for k, v in f_test(fit, np.array([[0, 0, 1, 0]])).items()}
    {'f_value': 387.2, 'num_df': 1.0, 'den_df': 2.0, 'p_value': 0.003}
    """
    L = np.atleast_2d(np.asarray(L, float))
    b = fit.params.to_numpy()
    V = L @ fit.C @ L.T
    q = L.shape[0]
    F = float((L @ b) @ np.linalg.solve(V, L @ b)) / q
    evals, evecs = np.linalg.eigh(V)
    nus = np.array([fit.satterthwaite_df(evecs[:, m] @ L) for m in range(q)])
    ddf = _fai_cornelius_df(nus)
    return {"f_value": F, "num_df": float(q), "den_df": ddf, "p_value": float(stats.f.sf(F, q, ddf))}


def _plain_term(term: str) -> str:
    return re.sub(r"C\((\w+)(?:, *\w+)?\)", r"\1", term)


def type3_f_tests(
    fit: RemlFit, min_df: float = 3.0, rename: dict[str, str] | None = None, units: str = "2 voices per gender"
) -> pd.DataFrame:
    """Type-III F test per fixed term of a sum-to-zero coded `fit_reml` model.

    Each term's columns are tested jointly (`f_test`, Satterthwaite df). A term whose
    denominator df is below `min_df` is reported with testable = False, an empty p and
    the reason: its error variance rests on almost no independent units (with 2 voices
    per gender, a between-voice comparison has 2 df), so a p-value would pretend to a
    precision the design does not have.

    Parameters
    ----------
    fit : RemlFit
        A `fit_reml` model with ``C(f, Sum)`` factors.
    min_df : float
        Fewest denominator df for which a p-value is reported.
    rename : dict, optional
        Term name -> label (default: the factor names without ``C(..., Sum)``).
    units : str
        What the design replicates, named in the note of a term that is not testable.

    Returns
    -------
    DataFrame
        term, f_value, num_df, den_df, p_value, testable, note.

    Examples
    --------
    >>> import numpy as np
    >>> import pandas as pd
    >>> cells = pd.DataFrame({"voice_id": ["m1", "m1", "m2", "m2", "f1", "f1", "f2", "f2"],
    ...                       "voice_gender": ["male"] * 4 + ["female"] * 4,
    ...                       "phonation": ["modal", "breathy"] * 4,
    ...                       "y": [1.0, 3.1, 1.4, 3.3, 2.0, 4.6, 2.6, 4.8]})
    >>> fit = fit_reml("y ~ C(voice_gender, Sum) * C(phonation, Sum)", cells, {"voice": cells["voice_id"]})
    >>> cols = ["term", "f_value", "num_df", "den_df", "p_value", "testable"]
    >>> print(type3_f_tests(fit, min_df=1.5)[cols].round(3).to_string(index=False))
                      term  f_value  num_df  den_df  p_value  testable
                 Intercept   519.84     1.0     2.0    0.002      True
              voice_gender    27.04     1.0     2.0    0.035      True
                 phonation   387.20     1.0     2.0    0.003      True
    voice_gender:phonation     3.20     1.0     2.0    0.216      True
    >>> print(type3_f_tests(fit)["note"].iloc[1])
    not testable: 2.0 denominator df (< 3); the error stratum has too few independent units (2 voices per gender)
    """
    rows = []
    rename = rename or {}
    for term, cols in fit.term_columns.items():
        L = np.zeros((len(cols), len(fit.names)))
        for i, c in enumerate(cols):
            L[i, c] = 1.0
        res = f_test(fit, L)
        label = rename.get(term, _plain_term(term))
        ok = bool(np.isfinite(res["den_df"]) and res["den_df"] >= min_df)
        if ok:
            note = ""
        elif np.isfinite(res["den_df"]):
            note = (
                f"not testable: {res['den_df']:.1f} denominator df (< {min_df:g}); the error stratum has too few "
                f"independent units ({units})"
            )
        else:
            note = "not testable: its error variance is estimated as 0 (degenerate fit), so no df"
        rows.append({"term": label, **res, "p_value": res["p_value"] if ok else np.nan, "testable": ok, "note": note})
    return pd.DataFrame(rows, columns=["term", "f_value", "num_df", "den_df", "p_value", "testable", "note"])
