"""Statistics of the speech-continuation study (SC paper), as tidy DataFrames.

- success rate per system and the all-systems-succeeded filter;
- speaker similarity by system x phonation x gender (SC paper, Table 2);
- voice-quality preservation: REML linear mixed models with variance components
  (`fit_reml`) on the honest unit of the design, type-III F tests with
  Satterthwaite degrees of freedom (`type3_f_tests`) and Tukey-adjusted contrasts
  of continuation against prompt (`voice_quality_models`);
- Tukey p-values that keep their size far into the tail (`tukey_p_value`);
- beta regression of rescaled judge scores with prompt-clustered robust standard
  errors and non-significant interactions removed stepwise by robust Wald tests.
"""

from __future__ import annotations

import itertools
import re
import warnings
from typing import Any, Iterable

import numpy as np
import pandas as pd
from patsy import build_design_matrices
from scipy import stats

from voicebias.analysis.rounding import is_constant, negligible
from voicebias.analysis.status import NOT_ESTIMABLE, OK, STATUS_COLUMNS, NotEstimable
from voicebias.contract import SC_MEASURES


def success_table(df: pd.DataFrame) -> pd.DataFrame:
    """Share of continuation calls that succeeded, per system.

    Parameters
    ----------
    df : DataFrame
        One row per continuation call: system, status ('ok' when it succeeded).

    Returns
    -------
    DataFrame
        system, n (calls), succeeded, success_rate.

    Examples
    --------
    >>> import pandas as pd
    >>> calls = pd.DataFrame({"system": ["a"] * 3 + ["b"] * 3, "stimulus_id": ["s1", "s2", "s3"] * 2,
    ...                       "status": ["ok", "ok", "ok", "ok", "error", "ok"],
    ...                       "phonation": ["modal"] * 6, "voice_gender": ["male", "female", "male"] * 2,
    ...                       "speaker_similarity": [0.9, 0.8, 0.7, 0.6, None, 0.5]})
    >>> print(success_table(calls).round(3).to_string(index=False))
    system  n  succeeded  success_rate
         a  3          3         1.000
         b  3          2         0.667
    """
    g = df.groupby("system")["status"]
    return (
        pd.DataFrame({"n": g.size(), "succeeded": g.apply(lambda s: int((s == "ok").sum()))})
        .assign(success_rate=lambda x: x["succeeded"] / x["n"])
        .reset_index()
    )


def all_systems_succeeded(df: pd.DataFrame, key: str = "stimulus_id") -> pd.DataFrame:
    """Rows of the inputs on which every system succeeded (the SC paper's comparison set).

    Parameters
    ----------
    df : DataFrame
        One row per call: system, status and the `key` column.
    key : str
        Column naming the input (one stimulus per value).

    Returns
    -------
    DataFrame
        The successful rows of `df` whose `key` every system answered successfully.

    Examples
    --------
    >>> import pandas as pd
    >>> calls = pd.DataFrame({"system": ["a"] * 3 + ["b"] * 3, "stimulus_id": ["s1", "s2", "s3"] * 2,
    ...                       "status": ["ok", "ok", "ok", "ok", "error", "ok"],
    ...                       "phonation": ["modal"] * 6, "voice_gender": ["male", "female", "male"] * 2,
    ...                       "speaker_similarity": [0.9, 0.8, 0.7, 0.6, None, 0.5]})
    >>> print(all_systems_succeeded(calls)[["system", "stimulus_id"]].to_string(index=False))
    system stimulus_id
         a          s1
         a          s3
         b          s1
         b          s3
    """
    systems = df["system"].nunique()
    ok = df[df["status"] == "ok"].groupby(key)["system"].nunique()
    keep = set(ok[ok == systems].index)
    return df[df[key].isin(keep) & (df["status"] == "ok")]


def similarity_table(df: pd.DataFrame, value: str = "speaker_similarity") -> pd.DataFrame:
    """Mean (SD, n) speaker similarity by system x phonation x voice gender.

    Parameters
    ----------
    df : DataFrame
        One row per continuation: system, phonation, voice_gender and `value`.
    value : str
        Column to summarise.

    Returns
    -------
    DataFrame
        system, phonation, voice_gender, mean, sd (NaN for a single row), n.

    Examples
    --------
    >>> import pandas as pd
    >>> calls = pd.DataFrame({"system": ["a"] * 3 + ["b"] * 3, "stimulus_id": ["s1", "s2", "s3"] * 2,
    ...                       "status": ["ok", "ok", "ok", "ok", "error", "ok"],
    ...                       "phonation": ["modal"] * 6, "voice_gender": ["male", "female", "male"] * 2,
    ...                       "speaker_similarity": [0.9, 0.8, 0.7, 0.6, None, 0.5]})
    >>> print(similarity_table(all_systems_succeeded(calls)).round(3).to_string(index=False))
    system phonation voice_gender  mean    sd  n
         a     modal         male  0.80 0.141  2
         b     modal         male  0.55 0.071  2
    """
    g = df.groupby(["system", "phonation", "voice_gender"])[value]
    return g.agg(mean="mean", sd="std", n="size").reset_index()


def _factor_terms(formula_rhs: str) -> list[str]:
    return [t.strip() for t in formula_rhs.split("+") if t.strip()]


def type3_wald(fit, term_names: Iterable[str] | None = None) -> pd.DataFrame:
    """Type-III Wald chi-square test per model term (fit with sum-to-zero contrasts).

    Each term's coefficients are tested jointly against zero with the fitted
    covariance; with sum-to-zero coding this is the type-III hypothesis.

    Parameters
    ----------
    fit : statsmodels results
        A fitted model with params (or fe_params) and cov_params(), its factors
        coded ``C(f, Sum)``.
    term_names : iterable of str, optional
        Terms to test (all but the intercept by default).

    Returns
    -------
    DataFrame
        term, chi2, df, p_value.

    Examples
    --------
    >>> import pandas as pd
    >>> import statsmodels.formula.api as smf
    >>> d = pd.DataFrame({"a": ["x", "x", "y", "y"] * 3, "b": ["u", "v"] * 6,
    ...                   "y": [1.0, 1.6, 2.1, 3.4, 1.9, 1.2, 1.5, 2.6, 0.8, 2.3, 2.9, 2.0]})
    >>> fit = smf.ols("y ~ C(a, Sum) * C(b, Sum)", d).fit()
    >>> print(type3_wald(fit).round(3).to_string(index=False))
                   term  chi2  df  p_value
              C(a, Sum) 6.604   1    0.010
              C(b, Sum) 1.709   1    0.191
    C(a, Sum):C(b, Sum) 0.002   1    0.964
    """
    params = fit.fe_params if hasattr(fit, "fe_params") else fit.params
    names = list(params.index)
    cov = fit.cov_params().loc[names, names].to_numpy()
    groups: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        if n == "Intercept":
            continue
        term = ":".join(re.sub(r"\[.*?\]$", "", part) for part in n.split(":"))
        groups.setdefault(term, []).append(i)
    rows = []
    for term, idx in groups.items():
        if term_names is not None and term not in term_names:
            continue
        b = params.to_numpy()[idx]
        v = cov[np.ix_(idx, idx)]
        chi2 = float(b @ np.linalg.solve(v, b))
        rows.append({"term": term, "chi2": chi2, "df": len(idx), "p_value": float(stats.chi2.sf(chi2, len(idx)))})
    return pd.DataFrame(rows)


def emm_pairwise(
    fit, data: pd.DataFrame, factor: str, by: list[str] | None = None, df_resid: float | None = None
) -> pd.DataFrame:
    """Estimated marginal means of `factor` (within each `by` cell) and Tukey-adjusted pairwise contrasts.

    EMMs average the model's predictions over an equally weighted grid of all other
    factors in the model. p-values use the studentized range with df_resid
    (residual df for OLS; None = asymptotic, as for mixed models).

    Parameters
    ----------
    fit : statsmodels results
        A formula-fitted model (its design rebuilds the grid).
    data : DataFrame
        The data the model was fitted on.
    factor : str
        Factor whose levels are compared.
    by : list of str, optional
        Factors within whose cells the comparisons are made.
    df_resid : float, optional
        Error df of the studentized range (None: asymptotic).

    Returns
    -------
    DataFrame
        The `by` columns, then factor, level_a, level_b, estimate (EMM of a minus
        EMM of b), se, t, p_tukey (Tukey over the levels of `factor` in the cell).

    Examples
    --------
    >>> import pandas as pd
    >>> import statsmodels.formula.api as smf
    >>> d = pd.DataFrame({"g": ["p", "q", "r"] * 4,
    ...                   "y": [1.0, 2.0, 4.0, 1.5, 2.5, 3.5, 0.5, 1.5, 4.5, 1.0, 2.0, 4.0]})
    >>> fit = smf.ols("y ~ C(g, Sum)", d).fit()
    >>> print(emm_pairwise(fit, d, "g", df_resid=fit.df_resid).round(4).to_string(index=False))
    factor level_a level_b  estimate     se        t  p_tukey
         g       p       q      -1.0 0.2887  -3.4641   0.0176
         g       p       r      -3.0 0.2887 -10.3923   0.0000
         g       q       r      -2.0 0.2887  -6.9282   0.0002
    """
    by = by or []
    design = fit.model.data.model_spec
    factors = [c for c in data.columns if c in _model_factors(fit)]
    levels = {f: sorted(data[f].dropna().unique()) for f in factors}
    grid = pd.DataFrame(list(itertools.product(*levels.values())), columns=list(levels))
    for col in data.columns:
        if col not in grid:
            grid[col] = data[col].iloc[0]
    X = np.asarray(build_design_matrices([design], grid)[0])
    params = fit.fe_params if hasattr(fit, "fe_params") else fit.params
    beta = params.to_numpy()
    cov = fit.cov_params().loc[params.index, params.index].to_numpy()
    df = np.inf if df_resid is None else float(df_resid)
    rows = []
    by_cells = grid[by].drop_duplicates().itertuples(index=False) if by else [()]
    for cell in by_cells:
        mask = np.ones(len(grid), bool)
        for f, v in zip(by, cell):
            mask &= (grid[f] == v).to_numpy()
        L = {lv: X[mask & (grid[factor] == lv).to_numpy()].mean(axis=0) for lv in levels[factor]}
        k = len(L)
        for a, b in itertools.combinations(levels[factor], 2):
            c = L[a] - L[b]
            est = float(c @ beta)
            se = float(np.sqrt(c @ cov @ c))
            t = est / se if se > 0 else np.nan
            p = tukey_p_value(t, k, df)
            rows.append(
                {
                    **dict(zip(by, cell)),
                    "factor": factor,
                    "level_a": a,
                    "level_b": b,
                    "estimate": est,
                    "se": se,
                    "t": t,
                    "p_tukey": min(p, 1.0),
                }
            )
    return pd.DataFrame(rows)


def _model_factors(fit) -> set[str]:
    formula = fit.model.formula
    return set(re.findall(r"C\((\w+)", formula)) | {
        w for w in re.findall(r"\b(\w+)\b", formula.split("~")[1]) if w not in {"C", "Sum", "Treatment"}
    }


# ------------------------------------------------------------------ Tukey tail


def _gauss_legendre(lo: np.ndarray, hi: np.ndarray, panels: int, nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights on [lo, hi] (per row) split into equal panels."""
    t, w = np.polynomial.legendre.leggauss(nodes)
    edges = np.linspace(0.0, 1.0, panels + 1)
    u = np.concatenate([(a + b) / 2 + (b - a) / 2 * t for a, b in zip(edges[:-1], edges[1:])])
    wu = np.concatenate([(b - a) / 2 * w for a, b in zip(edges[:-1], edges[1:])])
    span = (hi - lo)[..., None]
    return lo[..., None] + span * u, span * wu


def _log_range_sf_normal(q: np.ndarray, k: int) -> np.ndarray:
    """log P(range of k iid standard normals > q), vectorised over q > 0, in log space.

    P(R > q) = k * int phi(x) [Phi(x)^(k-1) - (Phi(x) - Phi(x - q))^(k-1)] dx (x the
    maximum). The bracket is Phi(x)^(k-1) * -expm1((k-1) log1p(-r)), r = Phi(x-q)/Phi(x),
    taken as (k-1) r when r < 1e-12, so nothing is formed as 1 minus a number near 1
    and the tail keeps its relative precision at any size. Gauss-Legendre quadrature
    on [-9, q + 9] (q < 18) or [q/2 - 9, q/2 + 9], where the integrand lives.
    """
    from scipy.special import log_ndtr, logsumexp

    q = np.atleast_1d(np.asarray(q, float))
    lo = np.where(q < 18, -9.0, q / 2 - 9.0)
    hi = np.where(q < 18, q + 9.0, q / 2 + 9.0)
    x, w = _gauss_legendre(lo, hi, 4, 24)
    la = log_ndtr(x)
    lr = np.minimum(log_ndtr(x - q[:, None]) - la, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        small = lr < np.log(1e-12)
        r = np.exp(np.where(small, np.log(0.5), lr))
        exact = np.log(-np.expm1((k - 1) * np.log1p(-np.minimum(r, 1 - 1e-16))))
    lbracket = np.where(small, np.log(k - 1) + lr, exact)
    lf = np.log(k) - 0.5 * x * x - 0.5 * np.log(2 * np.pi) + (k - 1) * la + lbracket
    return np.minimum(logsumexp(lf + np.log(w), axis=1), 0.0)


def log_studentized_range_sf(q: float, k: int, df: float) -> float:
    """log P(Q_{k,df} > q) by quadrature in log space (any tail size; see `studentized_range_sf`).

    Q = R / s with s = sqrt(chi2_df / df): the normal-range tail at q * s is averaged
    over the density of s on a log-s interval centred where the integrand peaks
    (s* ~ sqrt((df - 1) / (df + q^2 / 2))); df = inf: s = 1.

    Parameters
    ----------
    q : float
        Studentized range statistic (> 0).
    k : int
        Number of means in the family.
    df : float
        Error degrees of freedom (``np.inf`` for the asymptotic range).

    Returns
    -------
    float
        The natural log of the upper tail probability (<= 0).

    Examples
    --------
    >>> import numpy as np
    >>> round(log_studentized_range_sf(3.5, 3, 10), 4), round(float(np.log(studentized_range_sf(3.5, 3, 10))), 4)
    (-2.5626, -2.5626)
    >>> round(log_studentized_range_sf(40.0, 3, 10), 3)
    -22.357
    """
    from scipy.special import gammaln, logsumexp

    if not np.isfinite(df):
        return float(_log_range_sf_normal(np.array([q]), k)[0])
    centre = 0.5 * np.log(max(df - 1.0, 0.5) / (df + q * q / 2.0))
    width = 6.0 / np.sqrt(max(df, 1.0)) + 3.0
    u, w = _gauss_legendre(np.array(centre - width), np.array(min(centre + width, np.log(20.0))), 4, 32)
    sv = np.exp(u)
    # log density of s = sqrt(chi2_df / df), times ds/du = s
    lpdf = (np.log(2.0) + (df / 2) * np.log(df / 2) - gammaln(df / 2) + (df - 1) * u - df * sv * sv / 2) + u
    return float(min(logsumexp(lpdf + _log_range_sf_normal(q * sv, k) + np.log(w)), 0.0))


def studentized_range_sf(q: float, k: int, df: float) -> float:
    """Upper tail P(Q > q) of the studentized range of k means with df error degrees of freedom.

    Values above 1e-8 come from `scipy.stats.studentized_range.sf`, which agrees
    with R's ``ptukey(q, k, df, lower.tail = FALSE)``. Further out both compute the
    tail as 1 - cdf and lose every digit (scipy returns 0.0, R a floor near 1e-14,
    where the tail is 1e-20), so the tail is integrated directly in log space
    (`log_studentized_range_sf`).

    Parameters
    ----------
    q : float
        Studentized range statistic (|t| * sqrt(2) for a pairwise contrast).
    k : int
        Number of means in the family (>= 2).
    df : float
        Error degrees of freedom (> 0; ``np.inf`` for the asymptotic range).

    Returns
    -------
    float
        P(Q > q): 1 for q <= 0, 0 for q = inf.

    Raises
    ------
    ValueError
        If k < 2 or df is not positive.

    Examples
    --------
    >>> round(studentized_range_sf(3.5, 3, 10), 4)
    0.0771
    >>> f"{studentized_range_sf(40.0, 3, 10):.3e}"
    '1.951e-10'
    >>> studentized_range_sf(0.0, 3, 10)
    1.0
    """
    if k < 2:
        raise ValueError(f"the studentized range needs k >= 2 means, got {k}")
    if not df > 0:
        raise ValueError(f"the studentized range needs df > 0, got {df}")
    if not np.isfinite(q):
        return 0.0 if q > 0 else 1.0
    if q <= 0:
        return 1.0
    if np.isfinite(df) and df < 1e5:
        p = float(stats.studentized_range.sf(q, k, df))
        if p > 1e-8:
            return min(p, 1.0)
    return float(np.exp(log_studentized_range_sf(q, k, df)))


def tukey_p_value(t: float, k: int, df: float) -> float:
    """Tukey-adjusted p-value of a pairwise contrast with statistic t in a family of k means.

    p = P(Q_{k, df} > |t| sqrt(2)) (`studentized_range_sf`); for k = 2 the studentized
    range of two means is |t|, so p is the two-sided t (normal when df = inf) p-value.
    NaN when t or df is not finite and positive.

    Parameters
    ----------
    t : float
        t statistic of the contrast.
    k : int
        Number of means in the family.
    df : float
        Error degrees of freedom (``np.inf``: normal).

    Returns
    -------
    float
        The adjusted p-value.

    Examples
    --------
    >>> round(tukey_p_value(2.0, 2, 10), 4), round(tukey_p_value(2.0, 3, 10), 4)
    (0.0734, 0.1626)
    >>> tukey_p_value(float("nan"), 3, 10)
    nan
    """
    if not np.isfinite(t) or not (df > 0):
        return float("nan")
    if k == 2:
        return float(2 * (stats.t.sf(abs(t), df) if np.isfinite(df) else stats.norm.sf(abs(t))))
    return studentized_range_sf(abs(t) * np.sqrt(2.0), k, df)


# ------------------------------------------------------------------ REML with variance components


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
        self.G = {name: (codes[:, None] == codes[None, :]).astype(float) for name, codes in groups.items()}
        self.converged, self.llf = converged, llf
        n, p = X.shape
        H = np.eye(n) + sum(g * G for g, G in zip(gamma, self.G.values()))
        Hi = np.linalg.inv(H)
        XtHiX = X.T @ Hi @ X
        beta = np.linalg.solve(XtHiX, X.T @ Hi @ y)
        r = y - X @ beta
        s2 = float(r @ Hi @ r) / (n - p)
        self.s2 = s2
        self.vcomp = pd.Series([s2 * g for g in gamma] + [s2], index=[*groups, "residual"], dtype=float)
        self.Vi = Hi / s2
        self.C = np.linalg.inv(X.T @ self.Vi @ X)
        self.params = pd.Series(beta, index=names)
        self._vc_cov = self._variance_covariance()

    def cov_params(self) -> pd.DataFrame:
        """Covariance of the fixed effects, (X' V^-1 X)^-1 at the REML variance components."""
        return pd.DataFrame(self.C, index=self.names, columns=self.names)

    @property
    def bse(self) -> pd.Series:
        return pd.Series(np.sqrt(np.diag(self.C)), index=self.names)

    def _active(self) -> list[tuple[str, np.ndarray]]:
        """Every variance component with its Z Z' matrix (none is held fixed: see `fit_reml`)."""
        return [*self.G.items(), ("residual", np.eye(len(self.y)))]

    def _variance_covariance(self) -> np.ndarray:
        """Inverse observed REML information of the active variance components:
        I_ij = y' P V_i P V_j P y - tr(P V_i P V_j) / 2, P = V^-1 - V^-1 X C X' V^-1."""
        P = self.Vi - self.Vi @ self.X @ self.C @ self.X.T @ self.Vi
        act = self._active()
        PV = [P @ M for _, M in act]
        Py = P @ self.y
        m = len(act)
        info = np.empty((m, m))
        for i in range(m):
            for j in range(i, m):
                info[i, j] = info[j, i] = Py @ act[i][1] @ PV[j] @ Py - 0.5 * np.sum(PV[i] * PV[j].T)
        return np.linalg.pinv(info)

    def satterthwaite_df(self, contrast: np.ndarray) -> float:
        """Satterthwaite df of one contrast l'beta: 2 (l'Cl)^2 / (g' A g), g_i = d(l'Cl)/d s2_i
        = l'C X' V^-1 V_i V^-1 X C l, A the inverse observed REML information."""
        c = np.asarray(contrast, float)
        v = float(c @ self.C @ c)
        w = self.Vi @ self.X @ self.C @ c
        g = np.array([float(w @ M @ w) for _, M in self._active()])
        denom = float(g @ self._vc_cov @ g)
        return float(2 * v * v / denom) if denom > 0 else float("nan")  # NaN: no df (degenerate information)


def _reml_objective(gamma: np.ndarray, y: np.ndarray, X: np.ndarray, Gs: list[np.ndarray]) -> float:
    n, p = X.shape
    H = np.eye(n) + sum(g * G for g, G in zip(gamma, Gs))
    try:
        L = np.linalg.cholesky(H)
    except np.linalg.LinAlgError:
        return 1e300
    Li = np.linalg.inv(L)
    Xs, ys = Li @ X, Li @ y
    XtX = Xs.T @ Xs
    sign, logdet_x = np.linalg.slogdet(XtX)
    if sign <= 0:
        return 1e300
    beta = np.linalg.solve(XtX, Xs.T @ ys)
    rss = float(np.sum((ys - Xs @ beta) ** 2))
    return 2 * np.sum(np.log(np.diag(L))) + logdet_x + (n - p) * np.log(rss)


FREE_MARGIN = 1e-6
# The REML optimum is located when the deviance's derivative in each log variance ratio is
# below this (a located optimum gives about 1e-6 or less; a search stopped on the way, 1e-2 and
# more). The decision looks at where the search ended, not at the optimiser's own stopping flag,
# whose line search stops on the last bits of a flat deviance and so flips between machines.
GRADIENT_TOL = 1e-3


def _at_optimum(gamma: np.ndarray, y: np.ndarray, X: np.ndarray, Gs: list[np.ndarray], bounded: bool) -> bool:
    """The KKT conditions of the REML problem at gamma, by central differences in log gamma
    (forward differences in gamma at the bound gamma_j = 0, where the derivative must not be
    negative), to GRADIENT_TOL."""
    f0 = _reml_objective(gamma, y, X, Gs)
    if not np.isfinite(f0) or f0 >= 1e299:
        return False
    for j, g in enumerate(gamma):
        if bounded and g <= 1e-8:
            h = 1e-6
            up = gamma.copy()
            up[j] = g + h
            if (_reml_objective(up, y, X, Gs) - f0) / h < -GRADIENT_TOL:
                return False
            continue
        h = 1e-4 * max(abs(g), 1e-8)
        up, down = gamma.copy(), gamma.copy()
        up[j], down[j] = g + h, g - h
        d = (_reml_objective(up, y, X, Gs) - _reml_objective(down, y, X, Gs)) / (2 * h) * abs(g)
        if not np.isfinite(d) or abs(d) > GRADIENT_TOL:
            return False
    return True


def _reml_derivatives(
    gamma: np.ndarray, y: np.ndarray, X: np.ndarray, Gs: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and Hessian of `_reml_objective` in the variance ratios, analytically:
    with H = I + sum_j gamma_j G_j, P = H^-1 - H^-1 X (X'H^-1 X)^-1 X'H^-1, q = y'Py,
    a_j = y'P G_j P y and b_jk = y'P G_j P G_k P y, the deviance's derivatives are
    g_j = tr(P G_j) - (n - p) a_j / q and
    H_jk = -tr(P G_j P G_k) + (n - p) (2 b_jk / q - a_j a_k / q^2)."""
    n, p = X.shape
    Hi = np.linalg.inv(np.eye(n) + sum(g * G for g, G in zip(gamma, Gs)))
    HiX = Hi @ X
    P = Hi - HiX @ np.linalg.solve(X.T @ HiX, HiX.T)
    Py = P @ y
    q = float(y @ Py)
    PG = [P @ G for G in Gs]
    GPy = [G @ Py for G in Gs]
    a = np.array([float(Py @ v) for v in GPy])
    grad = np.array([float(np.trace(M)) for M in PG]) - (n - p) * a / q
    m = len(Gs)
    hess = np.empty((m, m))
    for j in range(m):
        for k in range(j, m):
            b = float(GPy[j] @ P @ GPy[k])
            hess[j, k] = hess[k, j] = -float(np.sum(PG[j] * PG[k].T)) + (n - p) * (2 * b / q - a[j] * a[k] / q**2)
    return grad, hess


def _polish(gamma: np.ndarray, y: np.ndarray, X: np.ndarray, Gs: list[np.ndarray], bounded: bool) -> np.ndarray:
    """Newton steps from a located REML optimum with the analytic derivatives, over the components
    not held at the bound (gamma_j > 1e-8 when `bounded`), until the step is rounding: the optimiser
    stops where its tolerances let it, which differs between machines in the sixth digit; the
    polished optimum agrees to rounding. Returns `gamma` unchanged where a step would leave the
    region (a component below 0 under the bound, H not positive definite) or raise the deviance."""
    x = np.asarray(gamma, float).copy()
    free = np.array([not bounded or g > 1e-8 for g in x])
    if not free.any():
        return x
    f = _reml_objective(x, y, X, Gs)
    for _ in range(30):
        grad, hess = _reml_derivatives(x, y, X, Gs)
        try:
            step = -np.linalg.solve(hess[np.ix_(free, free)], grad[free])
        except np.linalg.LinAlgError:
            return x
        nxt = x.copy()
        nxt[free] += step
        if (bounded and np.any(nxt < 0)) or not np.all(np.isfinite(nxt)):
            return x
        f_next = _reml_objective(nxt, y, X, Gs)
        if f_next >= 1e299 or f_next > f + 1e-9 * max(1.0, abs(f)):
            return x
        x, f = nxt, f_next
        if np.all(np.abs(step) <= 1e-14 * np.maximum(1.0, np.abs(x[free]))):
            break
    return x


def fit_reml(formula: str, data: pd.DataFrame, groups: dict[str, Iterable[Any]]) -> RemlFit:
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
    from scipy import optimize

    y_m, X_m = dmatrices(formula, data, return_type="dataframe", NA_action="raise")
    y, X = y_m.iloc[:, 0].to_numpy(float), X_m.to_numpy(float)
    if np.linalg.matrix_rank(X) < X.shape[1]:
        raise NotEstimable(f"the fixed-effects design of '{formula}' is rank deficient (empty cells?)")
    codes = {name: pd.factorize(pd.Series(list(g), index=data.index).astype(str))[0] for name, g in groups.items()}
    Gs = [(c[:, None] == c[None, :]).astype(float) for c in codes.values()]
    if X.shape[0] - X.shape[1] < 1:
        raise NotEstimable("no residual degrees of freedom: more fixed effects than observations")
    best = None
    # first the bounded fit (gamma >= 0, as lme4), then released from the bound: Nelder-Mead over the whole
    # region where H = I + sum gamma_j G_j is positive definite (the objective refuses the rest)
    for start in (0.1, 1.0, 5.0):
        res = optimize.minimize(
            _reml_objective,
            np.full(len(Gs), start),
            args=(y, X, Gs),
            method="L-BFGS-B",
            bounds=[(0.0, None)] * len(Gs),
            options={"maxiter": 1000, "ftol": 1e-14, "gtol": 1e-10},
        )
        if best is None or res.fun < best.fun:
            best = res
    assert best is not None
    best = optimize.OptimizeResult(x=best.x, fun=best.fun, success=_at_optimum(best.x, y, X, Gs, bounded=True))
    free = optimize.minimize(
        _reml_objective,
        best.x,
        args=(y, X, Gs),
        method="Nelder-Mead",
        options={
            "xatol": 1e-10,
            "fatol": 1e-13,
            "maxiter": 4000 * max(len(Gs), 1),
            "initial_simplex": best.x + np.vstack([np.zeros(len(Gs)), 0.05 * np.eye(len(Gs))]),
        },
    )
    # released from the bound only when that improves the REML deviance by a margin (1e-6), not by
    # rounding, and away from the edge of the region (V singular)
    if free.fun < best.fun - FREE_MARGIN:
        H = np.eye(len(y)) + sum(g * G for g, G in zip(free.x, Gs))
        if np.linalg.cond(H) < 1e10:
            best = optimize.OptimizeResult(x=free.x, fun=free.fun, success=_at_optimum(free.x, y, X, Gs, bounded=False))
    # convergence was decided at the located point, with its margin; the estimate is the polished optimum
    bounded = not np.any(best.x < 0)
    x = _polish(np.asarray(best.x, float), y, X, Gs, bounded=bounded)
    best = optimize.OptimizeResult(x=x, fun=_reml_objective(x, y, X, Gs), success=best.success)
    n, p = X.shape
    llf = -0.5 * (best.fun + (n - p) * (1 + np.log(2 * np.pi / (n - p))))
    design = X_m.design_info
    term_columns = {}
    for term, sl in design.term_name_slices.items():
        if term != "Intercept":
            term_columns[term] = list(range(sl.start, sl.stop))
    fit = RemlFit(
        y,
        X,
        list(X_m.columns),
        codes,
        np.asarray(best.x, float),
        bool(best.success),
        float(llf),
        {"Intercept": [0], **term_columns} if "Intercept" in X_m.columns else term_columns,
    )
    fit.design_info = design
    return fit


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


def type3_f_tests(fit: RemlFit, min_df: float = 3.0, rename: dict[str, str] | None = None) -> pd.DataFrame:
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
                "independent units (2 voices per gender)"
            )
        else:
            note = "not testable: its error variance is estimated as 0 (degenerate fit), so no df"
        rows.append({"term": label, **res, "p_value": res["p_value"] if ok else np.nan, "testable": ok, "note": note})
    return pd.DataFrame(rows, columns=["term", "f_value", "num_df", "den_df", "p_value", "testable", "note"])


def _factorial_formula(y: str, factors: list[str]) -> str:
    return f"{y} ~ " + ("*".join(f"C({f}, Sum)" for f in factors) if factors else "1")


def continuation_differences(vq: pd.DataFrame, measure: str, key: str = "stimulus_id") -> pd.DataFrame:
    """Continuation minus prompt per stimulus and system, averaged to voice x system x phonation cells.

    Each prompt is measured once (rows with source 'prompt'); each system's
    continuation of that stimulus is paired with it, so a continuation enters once
    and the prompt it continues is its within-stimulus reference. Stimulus,
    recording and prompt effects cancel in the difference; the cell mean over
    prompts is the unit of the voice-level model (`voice_quality_models`).

    Parameters
    ----------
    vq : DataFrame
        One row per measured recording: `key`, source (prompt or continuation),
        system, voice_id, voice_gender, phonation and the `measure` column.
    measure : str
        Column to difference.
    key : str
        Column pairing a continuation with its prompt.

    Returns
    -------
    DataFrame
        system, voice_id, voice_gender, phonation, d (mean continuation - prompt)
        and n (pairs in the cell).

    Examples
    --------
    Four voices, two phonation conditions, two prompts each; the continuation keeps
    half of the breathy shift:

    >>> import pandas as pd
    >>> voices = {"m1": ("male", 1.0), "m2": ("male", 1.6), "f1": ("female", 2.0), "f2": ("female", 2.9)}
    >>> cells = [(v, ph, s) for v in voices for ph in ("modal", "breathy") for s in ("p1", "p2")]
    >>> rows = []
    >>> for i, (v, ph, s) in enumerate(cells):
    ...     g, level = voices[v]
    ...     shift = 2.0 if ph == "breathy" else 0.0
    ...     common = {"stimulus_id": f"{v}-{ph}-{s}", "voice_id": v, "voice_gender": g, "phonation": ph}
    ...     rows += [{**common, "source": "prompt", "system": "",
    ...               "h1_h2_db": level + shift + (i * 53 % 7 - 3) / 10 + i / 50},
    ...              {**common, "source": "continuation", "system": "sys",
    ...               "h1_h2_db": level + shift / 2 + (i * 37 % 11 - 5) / 10}]
    >>> vq = pd.DataFrame(rows)
    >>> print(continuation_differences(vq, "h1_h2_db").round(3).to_string(index=False))
    system voice_id voice_gender phonation     d  n
       sys       f1       female   breathy -1.41  2
       sys       f1       female     modal  0.03  2
       sys       f2       female   breathy -1.39  2
       sys       f2       female     modal -0.30  2
       sys       m1         male   breathy -1.10  2
       sys       m1         male     modal -0.21  2
       sys       m2         male   breathy -1.08  2
       sys       m2         male     modal  0.01  2
    """
    prompts = vq[vq["source"] == "prompt"].dropna(subset=[measure]).drop_duplicates(key)
    cont = vq[vq["source"] == "continuation"].dropna(subset=[measure])
    pair = cont.merge(prompts[[key, measure]].rename(columns={measure: "_prompt"}), on=key, how="inner")
    pair["d"] = pair[measure] - pair["_prompt"]
    return pair.groupby(["system", "voice_id", "voice_gender", "phonation"], as_index=False).agg(
        d=("d", "mean"), n=("d", "size")
    )


def voice_quality_models(
    vq: pd.DataFrame, measures: Iterable[str] = SC_MEASURES, min_df: float = 3.0
) -> dict[str, pd.DataFrame]:
    """Voice-quality preservation per measure: REML mixed models on the honest unit, type-III F tests, Tukey contrasts.

    Design: prompts x voices (2 per gender) x phonation conditions; each stimulus is
    measured once as a prompt and once per continuation system. The continuation
    effect is modelled on d = continuation - prompt (`continuation_differences`),
    averaged over prompts to voice x system x phonation cells::

        d ~ system * voice_gender * phonation + (1 | voice) + (1 | voice:phonation) + (1 | voice:system)

    (voice:phonation and voice:system only with two or more systems; with one they
    are the residual). Terms on d are the source terms of the prompt/continuation
    factorial: the intercept is 'source' (continuation vs prompt), voice_gender on d
    is 'source:voice_gender', and so on. The prompts' own terms come from their cell
    means, ``y ~ voice_gender * phonation + (1 | voice)``. Voices are the replicated
    unit of every gender comparison, so the df are those of 4 voices, not of the
    hundreds of stimuli: REML (`fit_reml`: without the >= 0 bound on the components,
    so that balanced data give each stratum's exact F test), Satterthwaite df
    (lmerTest's method, `f_test`), and terms with fewer than `min_df` denominator df
    are reported as not testable, p empty.
    Prompt-to-prompt variation in the continuation shift is averaged within cells;
    with the same prompts in every cell it cancels from every term except the
    overall 'source' shift, whose test therefore generalises over voices, not prompts.

    Parameters
    ----------
    vq : DataFrame
        One row per measured recording (see `continuation_differences`) with a
        column per measure.
    measures : iterable of str
        Measures to model (one set of models each; absent measures are skipped).
    min_df : float
        Fewest denominator df for which a p-value is reported (`type3_f_tests`).

    Returns
    -------
    dict of DataFrame
        'type3': measure, model, term, f_value, num_df, den_df, p_value, testable,
        note, status ('ok' when the test was made, else 'not estimable' with the
        note as reason); 'contrasts': Tukey-adjusted pairwise contrasts of source
        (prompt and each system's continuation) within each voice_gender x phonation
        cell: voice_gender, phonation, factor, level_a, level_b, estimate (a - b), se,
        df, t, ci_low, ci_high (95 %, per contrast, t with the Satterthwaite df),
        p_tukey, testable, note, status ('ok' with an estimate and interval, the
        note saying why a p is withheld), reason; 'fits': measure, model, n_cells,
        n_obs, converged, variance components, status ('not estimable' when the
        model could not be fitted: no pairs, a constant measure, a rank-deficient
        design, too few voices, no convergence) and reason. Nothing here raises on
        such tables.

    Examples
    --------
    >>> import pandas as pd
    >>> voices = {"m1": ("male", 1.0), "m2": ("male", 1.6), "f1": ("female", 2.0), "f2": ("female", 2.9)}
    >>> cells = [(v, ph, s) for v in voices for ph in ("modal", "breathy") for s in ("p1", "p2")]
    >>> rows = []
    >>> for i, (v, ph, s) in enumerate(cells):
    ...     g, level = voices[v]
    ...     shift = 2.0 if ph == "breathy" else 0.0
    ...     common = {"stimulus_id": f"{v}-{ph}-{s}", "voice_id": v, "voice_gender": g, "phonation": ph}
    ...     rows += [{**common, "source": "prompt", "system": "",
    ...               "h1_h2_db": level + shift + (i * 53 % 7 - 3) / 10 + i / 50},
    ...              {**common, "source": "continuation", "system": "sys",
    ...               "h1_h2_db": level + shift / 2 + (i * 37 % 11 - 5) / 10}]
    >>> vq = pd.DataFrame(rows)
    >>> out = voice_quality_models(vq, measures=["h1_h2_db"], min_df=1.5)
    >>> t3 = out["type3"]
    >>> cols = ["term", "f_value", "num_df", "den_df", "p_value"]
    >>> print(t3[t3["model"] == "continuation - prompt"][cols].round(3).to_string(index=False))
                             term  f_value  num_df  den_df  p_value
                           source  193.250     1.0     2.0    0.005
              source:voice_gender    3.098     1.0     2.0    0.220
                 source:phonation  125.170     1.0     2.0    0.008
    source:voice_gender:phonation    1.862     1.0     2.0    0.306
    >>> cols = ["voice_gender", "phonation", "level_a", "level_b", "estimate", "df", "p_tukey"]
    >>> print(out["contrasts"][cols].round(3).to_string(index=False))
    voice_gender phonation level_a level_b  estimate    df  p_tukey
          female   breathy     sys  prompt    -1.400 3.997    0.000
          female     modal     sys  prompt    -0.135 3.997    0.246
            male   breathy     sys  prompt    -1.090 3.997    0.000
            male     modal     sys  prompt    -0.100 3.997    0.371
    >>> print(out["fits"][["model", "n_cells", "n_obs", "converged"]].to_string(index=False))
                    model  n_cells  n_obs  converged
    continuation - prompt        8     16       True
                   prompt        8     16       True
    """
    t3, contrasts, fits = [], [], []

    def fit_row(m: str, model: str, cells: pd.DataFrame, fit: RemlFit | None, problem: str = "") -> dict:
        n = {"measure": m, "model": model, "n_cells": len(cells), "n_obs": int(cells["n"].sum())}
        if fit is None:
            return {
                **n,
                "converged": False,
                "variance_components": f"not estimable: {problem}",
                "status": NOT_ESTIMABLE,
                "reason": problem,
            }
        return {
            **n,
            "converged": fit.converged,
            "variance_components": "; ".join(f"{k}={v:.4g}" for k, v in fit.vcomp.items()),
            "status": OK if fit.converged else NOT_ESTIMABLE,
            "reason": "" if fit.converged else "the REML optimisation did not converge",
        }

    def fitted(formula: str, cells: pd.DataFrame, groups: dict, y: str) -> tuple[RemlFit | None, str]:
        if is_constant(cells[y].to_numpy(float)):
            return (
                None,
                f"no variance: {'continuation - prompt' if y == 'd' else 'the prompt measure'}"
                " is the same in every cell",
            )
        try:
            return fit_reml(formula, cells, groups), ""
        except (NotEstimable, np.linalg.LinAlgError) as exc:
            return None, f"{exc} ({cells['voice_id'].nunique()} voices)"

    for m in measures:
        cells = continuation_differences(vq, m)
        if cells.empty:
            fits.append(
                fit_row(m, "continuation - prompt", cells, None, "no continuation paired with a measured prompt")
            )
            continue
        systems = sorted(cells["system"].unique())
        factors = [f for f in ("system", "voice_gender", "phonation") if cells[f].nunique() > 1]
        groups = {"voice": cells["voice_id"]}
        if len(systems) > 1:
            groups["voice:phonation"] = cells["voice_id"] + ":" + cells["phonation"]
            groups["voice:system"] = cells["voice_id"] + ":" + cells["system"]
        fit, problem = fitted(_factorial_formula("d", factors), cells, groups, "d")
        if fit is not None:
            rename = {
                "Intercept": "source",
                **{t: "source:" + _plain_term(t) for t in fit.term_columns if t != "Intercept"},
            }
            try:
                t3.append(type3_f_tests(fit, min_df, rename).assign(measure=m, model="continuation - prompt"))
                contrasts.append(_source_contrasts(fit, cells, factors, systems, min_df).assign(measure=m))
            except np.linalg.LinAlgError as exc:  # a singular covariance of the fixed effects
                fit, problem = None, f"singular covariance of the fixed effects: {exc}"
        fits.append(fit_row(m, "continuation - prompt", cells, fit, problem))
        pr = vq[(vq["source"] == "prompt")].dropna(subset=[m]).drop_duplicates("stimulus_id")
        pr = pr[pr["stimulus_id"].isin(vq.loc[vq["source"] == "continuation", "stimulus_id"])]
        pcells = pr.groupby(["voice_id", "voice_gender", "phonation"], as_index=False).agg(y=(m, "mean"), n=(m, "size"))
        pf = [f for f in ("voice_gender", "phonation") if pcells[f].nunique() > 1]
        if len(pcells) > (pcells[pf].drop_duplicates().shape[0] if pf else 1) + 1:
            pfit, problem = fitted(_factorial_formula("y", pf), pcells, {"voice": pcells["voice_id"]}, "y")
            if pfit is not None:
                try:
                    pt = type3_f_tests(pfit, min_df)
                    t3.append(pt[pt["term"] != "Intercept"].assign(measure=m, model="prompt"))
                except np.linalg.LinAlgError as exc:
                    pfit, problem = None, f"singular covariance of the fixed effects: {exc}"
            fits.append(fit_row(m, "prompt", pcells, pfit, problem))
    cols3 = ["measure", "model", "term", "f_value", "num_df", "den_df", "p_value", "testable", "note", *STATUS_COLUMNS]
    type3 = pd.concat(t3, ignore_index=True) if t3 else pd.DataFrame(columns=cols3)
    tested = type3["p_value"].notna() & np.isfinite(type3["f_value"].astype(float))
    type3["status"] = np.where(tested, OK, NOT_ESTIMABLE)
    type3["reason"] = np.where(
        tested, "", type3["note"].astype(str).where(type3["note"].astype(str) != "", "the F test is undefined")
    )
    return {
        "type3": type3[cols3],
        "contrasts": pd.concat(contrasts, ignore_index=True)
        if contrasts
        else pd.DataFrame(
            columns=[
                "voice_gender",
                "phonation",
                "factor",
                "level_a",
                "level_b",
                "estimate",
                "se",
                "df",
                "t",
                "ci_low",
                "ci_high",
                "p_tukey",
                "testable",
                "note",
                *STATUS_COLUMNS,
                "measure",
            ]
        ),
        "fits": pd.DataFrame(
            fits, columns=["measure", "model", "n_cells", "n_obs", "converged", "variance_components", *STATUS_COLUMNS]
        ),
    }


def _source_contrasts(
    fit: RemlFit, cells: pd.DataFrame, factors: list[str], systems: list[str], min_df: float
) -> pd.DataFrame:
    """Pairwise contrasts of prompt and each system's continuation within voice_gender x phonation cells.

    On the d scale the prompt is 0, system k's continuation is the cell's fitted d;
    the family of each cell has len(systems) + 1 levels (Tukey over them, each
    contrast with its Satterthwaite df)."""
    genders = sorted(cells["voice_gender"].unique())
    phons = sorted(cells["phonation"].unique())
    grid = pd.DataFrame(
        list(itertools.product(systems, genders, phons)), columns=["system", "voice_gender", "phonation"]
    )
    Xg = np.asarray(build_design_matrices([fit.design_info], grid)[0])
    beta = fit.params.to_numpy()
    k = len(systems) + 1
    rows = []
    for g, p in itertools.product(genders, phons):
        x = {
            s: Xg[((grid["system"] == s) & (grid["voice_gender"] == g) & (grid["phonation"] == p)).to_numpy()][0]
            for s in systems
        }
        pairs = [(s, "prompt", x[s]) for s in systems] + [
            (a, b, x[a] - x[b]) for a, b in itertools.combinations(systems, 2)
        ]
        for a, b, c in pairs:
            est = float(c @ beta)
            se = float(np.sqrt(c @ fit.C @ c))
            df = fit.satterthwaite_df(c)
            t = est / se if se > 0 else np.nan
            ok = bool(df >= min_df)  # False for NaN (no df: degenerate fit)
            half = float(stats.t.isf(0.025, df)) * se if np.isfinite(df) else float(stats.norm.isf(0.025)) * se
            note = (
                ""
                if ok
                else (
                    f"not testable: {df:.1f} df (< {min_df:g}); 2 voices per gender"
                    if np.isfinite(df)
                    else "not testable: no df (degenerate fit)"
                )
            )
            # an estimate with its interval is 'ok' even where the test is withheld (note says why)
            estimated = bool(np.isfinite(est) and se > 0 and np.isfinite(est - half) and np.isfinite(est + half))
            rows.append(
                {
                    "voice_gender": g,
                    "phonation": p,
                    "factor": "source",
                    "level_a": a,
                    "level_b": b,
                    "estimate": est,
                    "se": se,
                    "df": df,
                    "t": t,
                    "ci_low": est - half,
                    "ci_high": est + half,
                    "p_tukey": tukey_p_value(t, k, df) if ok else np.nan,
                    "testable": ok,
                    "note": note,
                    "status": OK if estimated else NOT_ESTIMABLE,
                    "reason": note if estimated else "no variance: the contrast has no standard error",
                }
            )
    return pd.DataFrame(rows)


def rescale_scores(scores: pd.Series, low: float = 1.0, high: float = 5.0) -> pd.Series:
    """Map bounded scores into (0, 1) for beta regression (Smithson & Verkuilen, 2006):
    y' = ((y - low) / (high - low) * (n - 1) + 0.5) / n.

    Parameters
    ----------
    scores : Series
        Scores on [low, high]; n counts the non-missing ones.
    low, high : float
        Bounds of the score scale.

    Returns
    -------
    Series
        The rescaled scores, strictly inside (0, 1).

    Examples
    --------
    >>> import pandas as pd
    >>> rescale_scores(pd.Series([1.0, 3.0, 5.0, 5.0])).tolist()
    [0.125, 0.5, 0.875, 0.875]
    """
    n = scores.notna().sum()
    return ((scores - low) / (high - low) * (n - 1) + 0.5) / n


def _terms_formula(y: str, terms: list[frozenset]) -> str:
    parts = [":".join(f"C({f}, Sum)" for f in sorted(t)) for t in sorted(terms, key=lambda t: (len(t), sorted(t)))]
    return f"{y} ~ " + (" + ".join(parts) if parts else "1")


def _fit_beta(formula: str, data: pd.DataFrame, cluster: str | None = None):
    """The BetaModel fit of `formula`; NotEstimable when the design is rank deficient (an empty
    cell of the factorial), the optimiser does not converge or the covariance is not finite."""
    from statsmodels.othermod.betareg import BetaModel

    kw: dict[str, Any] = {}
    if cluster is not None:
        kw = {"cov_type": "cluster", "cov_kwds": {"groups": pd.factorize(data[cluster])[0]}}
    model = BetaModel.from_formula(formula, data)
    X = np.asarray(model.exog, float)
    if np.linalg.matrix_rank(X) < X.shape[1]:
        raise NotEstimable(f"singular design: '{formula}' is rank deficient (an empty cell of the factorial)")
    if X.shape[0] <= X.shape[1] + 1:
        raise NotEstimable(f"{X.shape[0]} observations for {X.shape[1] + 1} parameters")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = model.fit(disp=0, maxiter=500, **kw)
    if not fit.mle_retvals.get("converged", True):
        raise NotEstimable(f"the beta regression '{formula}' did not converge")
    if not (np.all(np.isfinite(fit.params)) and np.all(np.isfinite(fit.bse)) and np.isfinite(fit.llf)):
        raise NotEstimable(f"the beta regression '{formula}' has no finite estimate or covariance")
    return fit


def _term_of(name: str) -> str:
    return ":".join(re.sub(r"C\((\w+), Sum\)(\[.*?\])?$", r"\1", part) for part in name.split(":"))


def beta_regression_stepwise(
    df: pd.DataFrame,
    y: str,
    factors: Iterable[str],
    alpha: float = 0.05,
    cluster: str | None = None,
    between_unit_factors: Iterable[str] = (),
) -> dict[str, pd.DataFrame]:
    """Beta regression of y (in (0, 1)) on the full factorial of `factors`, then stepwise removal.

    Maximum likelihood with a logit mean and log precision (statsmodels BetaModel).
    Observations that share a `cluster` (the prompt: every voice, condition and
    system continues the same text) are not independent, and a beta regression with
    a random effect is not available, so with `cluster` the standard errors are
    cluster-robust (sandwich over clusters, statsmodels' small-sample factor
    G/(G-1) (N-1)/(N-K)) and every test is a robust Wald test referred to F(q, G - 1)
    (t with G - 1 df for one coefficient); without it, model-based SEs and Wald
    chi-square tests. At each step every interaction not contained in a
    higher-order remaining term is tested; the least significant one with p > alpha
    is dropped; main effects are kept. Terms containing a `between_unit_factors`
    factor (voice_gender: 2 voices per gender, no voice random effect here) are not
    tested: they stay in the model, their p is empty and `note` says why.

    Parameters
    ----------
    df : DataFrame
        One row per judged continuation: y, the `factors` and `cluster`.
    y : str
        Outcome column, in (0, 1) (`rescale_scores`).
    factors : iterable of str
        Factors of the full factorial.
    alpha : float
        Interactions with p above it are removed; an interaction along which the scores do
        not vary at all (coefficients and SEs at rounding level) is removed first, with an
        empty stat and p. Such a coefficient in the final model is reported not testable
        (p empty), as are the terms of `between_unit_factors`.
    cluster : str, optional
        Column whose values group dependent observations.
    between_unit_factors : iterable of str
        Factors whose terms are kept untested.

    Returns
    -------
    dict of DataFrame
        'steps' (removed, stat, df, den_df, p_value), 'coefficients' (term, estimate,
        se, p_value, testable, note), 'kept_interactions' (term, testable), 'llf'.

    Raises
    ------
    NotEstimable
        When the data cannot support the model: a constant outcome, fewer than 2
        clusters, a rank-deficient design (an empty cell of the factorial), a fit that
        does not converge or has no finite covariance. Any other error is a fault.

    Examples
    --------
    Eight prompts, each continued in every gender x phonation cell, with additive
    gender and phonation effects (a small interaction on half the prompts): the interaction is
    removed, the main effects kept.

    >>> import pandas as pd
    >>> prompt_effect = [0.3, -0.2, 0.1, -0.4, 0.2, 0.0, -0.1, 0.4]
    >>> rows = [{"prompt": f"p{i}", "voice_gender": g, "phonation": ph,
    ...          "score": 3 + (0.8 if g == "male" else -0.4) + (-0.5 if ph == "creaky" else 0.3) + prompt_effect[i]
    ...          + (0.2 if (g, ph) == ("male", "creaky") else 0.0) * (i % 2)}
    ...         for i in range(8) for g in ("male", "female") for ph in ("modal", "creaky")]
    >>> d = pd.DataFrame(rows).assign(y=lambda x: rescale_scores(x["score"]))
    >>> res = beta_regression_stepwise(d, "y", ["phonation", "voice_gender"], cluster="prompt")
    >>> print(res["steps"].round(3).to_string(index=False))
                   removed  stat  df  den_df  p_value
    phonation:voice_gender 0.033   1     7.0    0.861
    >>> print(res["coefficients"][["term", "estimate", "se", "p_value"]].round(3).to_string(index=False))
                              term  estimate    se  p_value
                         Intercept     0.181 0.108    0.136
       C(phonation, Sum)[S.creaky]    -0.412 0.011    0.000
    C(voice_gender, Sum)[S.female]    -0.657 0.010    0.000
                         precision     4.068 0.404    0.000
    >>> len(res["kept_interactions"])
    0

    With voice_gender between units, its terms stay in the model untested:

    >>> res = beta_regression_stepwise(d, "y", ["phonation", "voice_gender"], cluster="prompt",
    ...                                between_unit_factors=["voice_gender"])
    >>> print(res["kept_interactions"].to_string(index=False))
                      term  testable
    phonation:voice_gender     False
    """
    factors = list(factors)
    between = set(between_unit_factors)
    terms = [frozenset(c) for r in range(1, len(factors) + 1) for c in itertools.combinations(factors, r)]
    steps = []
    if df[y].nunique() < 2:
        raise NotEstimable(f"degenerate outcome: {y} takes {df[y].nunique()} value(s)")
    n_clusters = int(df[cluster].nunique()) if cluster is not None else None
    if n_clusters is not None and n_clusters < 2:
        raise NotEstimable(f"cluster-robust SEs need at least 2 clusters of '{cluster}', got {n_clusters}")
    fit = _fit_beta(_terms_formula(y, terms), df, cluster)

    def no_variation(b: np.ndarray, v: np.ndarray) -> bool:
        # logit-scale coefficients and SEs below 1e-7 (voicebias.analysis.rounding): real data give SEs
        # of 1e-3 and more; an outcome that does not vary along a term gives 1e-15
        return all(negligible(x, 1.0) for x in (*b, *np.sqrt(np.abs(np.diag(v)))))

    def wald(f, t: frozenset) -> tuple[float, int, float]:
        names = list(f.params.index)
        idx = [
            i
            for i, n in enumerate(names)
            if n != "precision" and n != "Intercept" and frozenset(_term_of(n).split(":")) == t
        ]
        b = f.params.to_numpy()[idx]
        v = f.cov_params().to_numpy()[np.ix_(idx, idx)]
        if no_variation(b, v):
            # the scores do not vary along the term: coefficients and SEs are rounding, and a
            # Wald statistic of rounding over rounding is anything; the term goes first, untested
            return np.nan, len(idx), np.nan
        if np.linalg.matrix_rank(v) < len(idx):  # e.g. a cluster-robust covariance from fewer clusters than terms
            raise NotEstimable(f"the covariance of {':'.join(sorted(t))} is singular ({n_clusters} clusters)")
        stat = float(b @ np.linalg.solve(v, b))
        if n_clusters is None:
            return stat, len(idx), float(stats.chi2.sf(stat, len(idx)))
        return stat / len(idx), len(idx), float(stats.f.sf(stat / len(idx), len(idx), n_clusters - 1))

    while True:
        candidates = [t for t in terms if len(t) > 1 and not any(t < u for u in terms) and not (t & between)]
        tests = [(*wald(fit, t), t) for t in candidates]
        removable = [x for x in tests if np.isnan(x[2]) or x[2] > alpha]
        if not removable:
            break
        stat, ddf, p, t = max(removable, key=lambda x: np.inf if np.isnan(x[2]) else x[2])
        steps.append(
            {
                "removed": ":".join(sorted(t)),
                "stat": stat,
                "df": ddf,
                "den_df": float(n_clusters - 1) if n_clusters else np.inf,
                "p_value": p,
            }
        )
        terms = [u for u in terms if u != t]
        fit = _fit_beta(_terms_formula(y, terms), df, cluster)
    names = list(fit.params.index)
    se = fit.bse.to_numpy()
    z = fit.params.to_numpy() / se
    p = 2 * (stats.t.sf(np.abs(z), n_clusters - 1) if n_clusters else stats.norm.sf(np.abs(z)))
    between_note = "not testable: voice_gender varies between voices (2 per gender) and the model has no voice effect"
    flat_note = "not testable: the scores do not vary along this term (estimate and SE are rounding)"
    notes = []
    for n, b, s in zip(names, fit.params.to_numpy(), se):
        if n not in ("Intercept", "precision") and bool(set(_term_of(n).split(":")) & between):
            notes.append(between_note)
        elif n not in ("Intercept", "precision") and no_variation(np.array([b]), np.array([[s * s]])):
            notes.append(flat_note)
        else:
            notes.append("")
    coefs = pd.DataFrame(
        {
            "term": names,
            "estimate": fit.params.to_numpy(),
            "se": se,
            "p_value": np.where([bool(x) for x in notes], np.nan, p),
            "testable": [not x for x in notes],
            "note": notes,
        }
    )
    kept = [t for t in terms if len(t) > 1]
    return {
        "steps": pd.DataFrame(steps, columns=["removed", "stat", "df", "den_df", "p_value"]),
        "coefficients": coefs,
        "kept_interactions": pd.DataFrame(
            {"term": [":".join(sorted(t)) for t in kept], "testable": [not (t & between) for t in kept]}
        ),
        "llf": pd.DataFrame([{"llf": fit.llf}]),
    }
