"""Statistics of the audit, each returning a labelled pandas DataFrame.

Describe (RQ2, S2S paper sec. 4): a logistic model of P(judged female) on the content ordinal
(masculine=0 < neutral=1 < feminine=2) controlling for the true voice, reported as the odds ratio
per content step. Separation is detected before fitting (Albert & Anderson, 1984) and reported as
such, with Firth's estimate in its place. With repeats each item enters with the share of its
compliant answers (a fractional logit), and the misaligned-vs-neutral test permutes items.

See docs/analysis.md, "Describe", and docs/repeats.md.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy import stats
from scipy.optimize import linprog
from statsmodels.discrete.discrete_model import Logit
from statsmodels.genmod.families import Binomial
from statsmodels.genmod.generalized_linear_model import GLM
from statsmodels.tools.tools import add_constant

from voicebias.analysis.status import NOT_ESTIMABLE, OK, SEPARATION, STATUS_COLUMNS, NotEstimable
from voicebias.contract import POLE_ORDINAL, SAMPLE

OR_COLUMNS = [
    "scope",
    "n",
    "n_excluded",
    "odds_ratio",
    "ci_low",
    "ci_high",
    "p_value",
    "coef",
    "se",
    "fit_status",
    "firth_odds_ratio",
    "firth_ci_low",
    "firth_ci_high",
    "firth_p_value",
    *STATUS_COLUMNS,
]


def detect_separation(X: np.ndarray, y: np.ndarray, tol: float = 1e-7) -> str:
    """'none', 'quasi-complete' or 'complete' separation of binary y by the columns of X.

    Solves max sum_i s_i x_i.b subject to s_i x_i.b >= 0 and |b_j| <= 1 with
    s_i = 2 y_i - 1. A positive optimum means some direction b classifies every
    observation without error and at least one strictly, so the MLE is infinite.

    Parameters
    ----------
    X : array of shape (n, k)
        Design matrix (with its constant column).
    y : array of shape (n,)
        Binary outcome (0/1).
    tol : float
        Optimum (relative to n) below which the data count as not separated.

    Returns
    -------
    str
        'none', 'quasi-complete' (some observations on the separating hyperplane)
        or 'complete'.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[1, 0], [1, 1], [1, 2], [1, 3]], float)
    >>> detect_separation(X, [0, 0, 1, 1]), detect_separation(X, [0, 1, 0, 1])
    ('complete', 'none')
    >>> detect_separation(np.array([[1, 0], [1, 1], [1, 1], [1, 2]], float), [0, 0, 1, 1])
    'quasi-complete'
    """
    X = np.asarray(X, float)
    s = 2 * np.asarray(y, float) - 1
    A = s[:, None] * X
    k = X.shape[1]
    res = linprog(-A.sum(axis=0), A_ub=-A, b_ub=np.zeros(len(A)), bounds=[(-1, 1)] * k, method="highs")
    if res.status != 0 or -res.fun <= tol * max(1.0, len(A)):
        return "none"
    # complete: maximise the smallest margin t subject to A b >= t
    c = np.zeros(k + 1)
    c[-1] = -1.0
    A_ub = np.hstack([-A, np.ones((len(A), 1))])
    res2 = linprog(c, A_ub=A_ub, b_ub=np.zeros(len(A)), bounds=[(-1, 1)] * k + [(None, 1)], method="highs")
    return "complete" if res2.status == 0 and -res2.fun > tol else "quasi-complete"


def describe_design(df: pd.DataFrame) -> pd.DataFrame:
    """Compliant describe rows with content_step, voice_female and y (judged female).

    Parameters
    ----------
    df : DataFrame
        Describe rows with pole, voice_gender and judged_gender (male, female or
        none); rows judged 'none' are dropped.

    Returns
    -------
    DataFrame
        The compliant rows of `df` with three float columns added: content_step
        (masculine 0, neutral 1, feminine 2), voice_female (1 for a female input
        voice) and y (1 when judged female).

    Examples
    --------
    >>> import pandas as pd
    >>> rows = pd.DataFrame({"pole": ["masculine", "neutral", "feminine"] * 2,
    ...                      "voice_gender": ["male"] * 3 + ["female"] * 3,
    ...                      "judged_gender": ["male", "none", "female", "female", "female", "female"]})
    >>> d = describe_design(rows)
    >>> print(d[["pole", "voice_gender", "content_step", "voice_female", "y"]].to_string(index=False))
         pole voice_gender  content_step  voice_female   y
    masculine         male           0.0           0.0 0.0
     feminine         male           2.0           0.0 1.0
    masculine       female           0.0           1.0 1.0
      neutral       female           1.0           1.0 1.0
     feminine       female           2.0           1.0 1.0
    """
    d = df[df["judged_gender"].isin(["male", "female"])].copy()
    d["content_step"] = d["pole"].map(POLE_ORDINAL).astype(float)
    d["voice_female"] = (d["voice_gender"] == "female").astype(float)
    d["y"] = (d["judged_gender"] == "female").astype(float)
    return d


def odds_ratio_per_step(df: pd.DataFrame, scope: str = "ALL", confidence: float = 0.95) -> pd.DataFrame:
    """Odds ratio per content step from P(female) ~ content_step + voice_female.

    `df` holds describe rows with pole, voice_gender and judged_gender
    (male/female/none; 'none' rows are non-compliant and excluded, counted).
    fit_status is 'ok', 'perfect separation (complete|quasi-complete)',
    'singular ...', 'did not converge' or 'no data'; the maximum-likelihood OR
    (Wald CI) is only reported when the fit is 'ok'. The Firth-penalised OR
    (profile-likelihood CI, penalised likelihood-ratio p) is offered alongside and
    stays finite under separation; a side of its CI that lies beyond what can be
    computed is reported infinite (`firth_coefficient`).

    status (voicebias.analysis.status) is 'ok' with the maximum-likelihood fit,
    'separation' when that estimate does not exist (complete or quasi-complete
    separation, or every compliant answer the same gender) and the Firth estimate is
    reported in its place, and 'not estimable' when there is no estimate at all (no
    compliant answer, only one content pole or one input voice, no fit); reason says
    which, in words. Nothing here raises on such tables.

    With repeats (a `sample` column) both fits take the item shares
    (`describe_item_design`): n counts the items with a compliant answer, n_excluded
    those without one, and the SEs are those of one binomial observation per item.
    Since the variance of an item's share never exceeds p (1 - p), the variance of one
    answer, these SEs hold whatever the answers of an item share; with identical
    repeats they are the SEs of one answer per item.

    Parameters
    ----------
    df : DataFrame
        Describe rows: pole, voice_gender, judged_gender.
    scope : str
        Label of the rows (a language, or 'ALL').
    confidence : float
        Level of both confidence intervals.

    Returns
    -------
    DataFrame
        One row with the columns of OR_COLUMNS: scope, n (compliant rows),
        n_excluded, odds_ratio, ci_low, ci_high, p_value (Wald), coef and se
        (log-odds), fit_status, firth_odds_ratio, firth_ci_low, firth_ci_high,
        firth_p_value.

    Examples
    --------
    Six answers per voice x pole cell, more of them 'female' the more feminine the
    content, one non-compliant answer:

    >>> import pandas as pd
    >>> rows = []
    >>> for voice, extra in (("male", 0), ("female", 1)):
    ...     for pole, k in (("masculine", 1), ("neutral", 2), ("feminine", 4)):
    ...         rows += [{"pole": pole, "voice_gender": voice,
    ...                   "judged_gender": "female" if j < k + extra else "male"} for j in range(6)]
    >>> rows.append({"pole": "neutral", "voice_gender": "male", "judged_gender": "none"})
    >>> res = odds_ratio_per_step(pd.DataFrame(rows))
    >>> cols = ["scope", "n", "n_excluded", "odds_ratio", "ci_low", "ci_high", "p_value", "fit_status"]
    >>> print(res[cols].round(3).to_string(index=False))
    scope  n  n_excluded  odds_ratio  ci_low  ci_high  p_value fit_status
      ALL 36           1       3.143   1.212    8.153    0.019         ok
    >>> firth = ["firth_odds_ratio", "firth_ci_low", "firth_ci_high", "firth_p_value"]
    >>> print(res[firth].round(3).to_string(index=False))
     firth_odds_ratio  firth_ci_low  firth_ci_high  firth_p_value
                2.791         1.208          7.413          0.015
    """
    weights = None
    if SAMPLE in df.columns:
        d, n, n_excl = describe_item_design(df)
        weights = d["weight"].to_numpy(float)
    else:
        d = describe_design(df)
        n, n_excl = int(len(d)), int(len(df) - len(d))
    row = {
        "scope": scope,
        "n": n,
        "n_excluded": n_excl,
        "odds_ratio": np.nan,
        "ci_low": np.nan,
        "ci_high": np.nan,
        "p_value": np.nan,
        "coef": np.nan,
        "se": np.nan,
        "firth_odds_ratio": np.nan,
        "firth_ci_low": np.nan,
        "firth_ci_high": np.nan,
        "firth_p_value": np.nan,
    }

    def result(fit_status: str, status: str, reason: str) -> pd.DataFrame:
        return pd.DataFrame([{**row, "fit_status": fit_status, "status": status, "reason": reason}], columns=OR_COLUMNS)

    if len(d) == 0:
        return result("no data", NOT_ESTIMABLE, "no compliant answer (none names a gender)" if n_excl else "no answers")
    X = add_constant(d[["content_step", "voice_female"]].to_numpy(), has_constant="add")
    if np.linalg.matrix_rank(X) < X.shape[1]:
        missing = [
            what
            for what, col in (("one content pole", "content_step"), ("one input voice", "voice_female"))
            if d[col].nunique() < 2
        ]
        return result(
            "singular (design not full rank)",
            NOT_ESTIMABLE,
            f"only {' and '.join(missing) or 'collinear content and voice'} among the compliant answers: "
            "the content step and the voice cannot both be estimated",
        )
    y = d["y"].to_numpy()
    firth_note = ""
    try:
        firth = firth_coefficient(X, y, 1, confidence, weights=weights)
    except NotEstimable as exc:
        firth_note = f"Firth estimate not estimable: {exc}"
    else:
        with np.errstate(over="ignore"):
            row.update(
                firth_odds_ratio=float(np.exp(firth["coef"])),
                firth_ci_low=float(np.exp(firth["ci_low"])),
                firth_ci_high=float(np.exp(firth["ci_high"])),
                firth_p_value=firth["p_value"],
            )
        open_sides = [side for side, v in (("lower", firth["ci_low"]), ("upper", firth["ci_high"])) if np.isinf(v)]
        if open_sides:
            firth_note = f"Firth profile CI open on the {' and '.join(open_sides)} side"
    has_firth = bool(np.isfinite(row["firth_odds_ratio"]))

    def separated(fit_status: str, what: str) -> pd.DataFrame:
        if not has_firth:
            return result(fit_status, NOT_ESTIMABLE, "; ".join(x for x in (what, firth_note) if x))
        return result(
            fit_status,
            SEPARATION,
            "; ".join(
                x
                for x in (
                    f"{what}: the maximum-likelihood odds ratio does not exist; the Firth estimate is reported",
                    firth_note,
                )
                if x
            ),
        )

    if d["y"].nunique() < 2:
        judged = "female" if float(d["y"].iloc[0]) == 1.0 else "male"
        return separated("singular (one outcome only)", f"every compliant answer is '{judged}'")
    sep = detect_separation(X, y)
    if sep != "none":
        return separated(f"perfect separation ({sep})", f"{sep} separation")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if weights is None or bool(np.all(weights == 1.0)):
                # without repeats, or every item's answers agree: one 0/1 outcome per item
                fit = Logit(y, X).fit(disp=0, maxiter=200)
                converged = fit.mle_retvals.get("converged", True)
            else:  # the item shares: binomial likelihood of the weighted rows, model-based (item-level) SE
                fit = GLM(y, X, family=Binomial(), freq_weights=weights).fit(maxiter=200, tol=1e-12)
                converged = fit.converged
    except np.linalg.LinAlgError as exc:  # a singular information matrix at some step
        return result(
            "did not converge",
            NOT_ESTIMABLE,
            "; ".join(x for x in (f"maximum-likelihood fit failed: {exc}", firth_note) if x),
        )
    b, se = float(fit.params[1]), float(fit.bse[1])
    z = stats.norm.ppf(0.5 + confidence / 2)
    with np.errstate(over="ignore", invalid="ignore"):
        row.update(
            odds_ratio=float(np.exp(b)),
            ci_low=float(np.exp(b - z * se)),
            ci_high=float(np.exp(b + z * se)),
            p_value=float(fit.pvalues[1]),
            coef=b,
            se=se,
        )
    if not (converged and se > 0 and all(np.isfinite(row[k]) for k in ("coef", "se", "p_value"))):
        return result(
            "did not converge",
            NOT_ESTIMABLE,
            "; ".join(x for x in ("the maximum-likelihood fit did not converge to a finite estimate", firth_note) if x),
        )
    return result("ok", OK, firth_note)


def _item_keys(df: pd.DataFrame) -> list[str]:
    """The columns that name one item (system, task, stimulus) among those `df` has."""
    return [c for c in ("system", "task", "stimulus_id") if c in df.columns]


def describe_item_design(df: pd.DataFrame) -> tuple[pd.DataFrame, int, int]:
    """The describe design of answers with repeats: (rows, items, items excluded).

    Each item (stimulus) with at least one compliant answer gives its share of 'female'
    among its compliant answers, ybar, as two rows of the `describe_design` columns:
    y = 1 with weight ybar and y = 0 with weight 1 - ybar (a row of weight 0 left out).
    The weighted binomial log-likelihood of these rows is the fractional-logit
    log-likelihood of the item shares, sum ybar log p + (1 - ybar) log(1 - p), and its
    information is one binomial observation per item: the item, not the answer, is the
    unit. Items whose answers are all non-compliant are excluded (counted).

    Parameters
    ----------
    df : DataFrame
        Describe answers with a sample column: stimulus_id (and system, task), pole,
        voice_gender, judged_gender.

    Returns
    -------
    tuple
        (rows, items, items_excluded): rows has the item keys, the `describe_design`
        columns content_step, voice_female, y, and weight; items counts the items with a
        compliant answer, items_excluded those without one.

    Examples
    --------
    >>> import pandas as pd
    >>> rows = pd.DataFrame({"stimulus_id": ["a"] * 3 + ["b"] * 3 + ["c"] * 2, "sample": [0, 1, 2] * 2 + [0, 1],
    ...                      "pole": ["feminine"] * 3 + ["masculine"] * 3 + ["neutral"] * 2,
    ...                      "voice_gender": ["male"] * 8,
    ...                      "judged_gender": ["female", "female", "male", "male", "male", "none", "none", "none"]})
    >>> d, n, excluded = describe_item_design(rows)
    >>> print(d[["stimulus_id", "content_step", "y", "weight"]].round(3).to_string(index=False))
    stimulus_id  content_step   y  weight
              a           2.0 1.0   0.667
              a           2.0 0.0   0.333
              b           0.0 0.0   1.000
    >>> n, excluded
    (2, 1)
    """
    keys = _item_keys(df)
    d = describe_design(df)
    items = d.groupby(keys, sort=False).agg(
        content_step=("content_step", "first"), voice_female=("voice_female", "first"), share=("y", "mean")
    )
    items = items.reset_index()
    both = pd.concat([items.assign(y=1.0, weight=items["share"]), items.assign(y=0.0, weight=1.0 - items["share"])])
    both = both.assign(_order=np.r_[np.arange(len(items)), np.arange(len(items))]).sort_values("_order", kind="stable")
    rows = both[both["weight"] > 0].drop(columns=["share", "_order"]).reset_index(drop=True)
    n_items = int(df.groupby(keys).ngroups)
    return rows, int(len(items)), n_items - int(len(items))


def cell_type(pole: str, voice_gender: str) -> str:
    """'aligned', 'neutral' or 'misaligned' (voice opposes the content stereotype).

    Parameters
    ----------
    pole : str
        Content pole of the passage: masculine, neutral or feminine.
    voice_gender : str
        Gender of the input voice: male or female.

    Returns
    -------
    str
        The cell type of the pair.

    Examples
    --------
    >>> cell_type("feminine", "male"), cell_type("feminine", "female"), cell_type("neutral", "male")
    ('misaligned', 'aligned', 'neutral')
    """
    if pole == "neutral":
        return "neutral"
    return "aligned" if (pole == "feminine") == (voice_gender == "female") else "misaligned"


def misgender_rates(df: pd.DataFrame, by_voice: bool = False) -> pd.DataFrame:
    """Misgender rate (judged != voice gender among compliant answers) by language x cell type.

    Rows for each language and for ALL languages pooled; n counts compliant answers,
    n_excluded the non-compliant ones. With `by_voice` the rows are also split by
    input voice (a voice_gender column): the neutral cell of the male voice then
    counts 'female' answers, that of the female voice 'male' answers.

    With repeats (a `sample` column) the counts are of items (`misgender_items`): n the
    items with a compliant answer, n_excluded those without one, misgendered the sum of
    the items' misgendered shares (a fraction), so rate is the mean item share.

    Parameters
    ----------
    df : DataFrame
        Describe rows: lang, pole, voice_gender, judged_gender.
    by_voice : bool
        Split every row by input voice as well.

    Returns
    -------
    DataFrame
        lang, (voice_gender, with `by_voice`), cell_type (aligned, neutral,
        misaligned), n, n_excluded, misgendered, rate (misgendered / n; NaN
        when n is 0), status ('not estimable' when n is 0) and reason.

    Examples
    --------
    >>> import pandas as pd
    >>> desc = pd.DataFrame({"lang": ["en"] * 6 + ["es"] * 6,
    ...                      "pole": ["masculine", "neutral", "feminine"] * 4,
    ...                      "voice_gender": (["male"] * 3 + ["female"] * 3) * 2,
    ...                      "judged_gender": ["male", "male", "female", "female", "none", "female",
    ...                                        "male", "female", "female", "male", "female", "female"]})
    >>> print(misgender_rates(desc).drop(columns=["status", "reason"]).round(3).to_string(index=False))
    lang  cell_type  n  n_excluded  misgendered  rate
      en    aligned  2           0            0 0.000
      en    neutral  1           1            0 0.000
      en misaligned  2           0            1 0.500
      es    aligned  2           0            0 0.000
      es    neutral  2           0            1 0.500
      es misaligned  2           0            2 1.000
     ALL    aligned  4           0            0 0.000
     ALL    neutral  3           1            1 0.333
     ALL misaligned  4           0            3 0.750
    >>> by_voice = misgender_rates(desc, by_voice=True)
    >>> print(by_voice[by_voice["lang"] == "ALL"].drop(columns=["status", "reason"]).to_string(index=False))
    lang voice_gender  cell_type  n  n_excluded  misgendered  rate
     ALL         male    aligned  2           0            0   0.0
     ALL         male    neutral  2           0            1   0.5
     ALL         male misaligned  2           0            2   1.0
     ALL       female    aligned  2           0            0   0.0
     ALL       female    neutral  1           1            0   0.0
     ALL       female misaligned  2           0            1   0.5
    """
    repeats = SAMPLE in df.columns
    d = misgender_items(df) if repeats else df.copy()
    d["cell_type"] = [cell_type(p, v) for p, v in zip(d["pole"], d["voice_gender"])]
    if not repeats:
        d["compliant"] = d["judged_gender"].isin(["male", "female"])
        d["misgendered"] = d["compliant"] & (d["judged_gender"] != d["voice_gender"])
    voices = [("male", "male"), ("female", "female")] if by_voice else [(None, None)]
    rows = []
    for lang, g in [*d.groupby("lang"), ("ALL", d)]:
        for label, voice in voices:
            gv = g if voice is None else g[g["voice_gender"] == voice]
            for ct in ("aligned", "neutral", "misaligned"):
                c = gv[gv["cell_type"] == ct]
                n = int(c["compliant"].sum())
                k = float(c["misgendered"].sum()) if repeats else int(c["misgendered"].sum())
                row = {
                    "lang": lang,
                    "cell_type": ct,
                    "n": n,
                    "n_excluded": int(len(c) - n),
                    "misgendered": k,
                    "rate": k / n if n else np.nan,
                    "status": OK if n else NOT_ESTIMABLE,
                    "reason": ""
                    if n
                    else ("no compliant answer in this cell" if len(c) else "no answers in this cell"),
                }
                rows.append(row if voice is None else {"lang": lang, "voice_gender": label, **row})
    cols = [
        "lang",
        *(["voice_gender"] if by_voice else []),
        "cell_type",
        "n",
        "n_excluded",
        "misgendered",
        "rate",
        *STATUS_COLUMNS,
    ]
    return pd.DataFrame(rows, columns=cols)


FISHER_COLUMNS = [
    "lang",
    "voice_gender",
    "misaligned_misgendered",
    "misaligned_n",
    "neutral_misgendered",
    "neutral_n",
    "odds_ratio",
    "conditional_odds_ratio",
    "ci_low",
    "ci_high",
    "p_value",
    *STATUS_COLUMNS,
]


def _two_by_two_status(a: float, n1: int, c: float, n0: int, odds: float) -> tuple[str, str]:
    """status and reason of a misaligned-vs-neutral comparison: 'not estimable' when a cell type has no
    answers, 'separation' when a zero cell leaves the odds ratio `odds` infinite, zero or undefined."""
    empty = [name for name, n in (("misaligned", n1), ("neutral", n0)) if n == 0]
    if empty:
        return NOT_ESTIMABLE, f"no compliant answer in the {' or '.join(empty)} cells"
    if not (np.isfinite(odds) and odds > 0):
        word = "undefined" if np.isnan(odds) else "infinite" if odds > 0 else "zero"
        kinds = (
            "no answer misgenders" if a + c == 0 else "every answer misgenders" if a + c == n1 + n0 else "a zero cell"
        )
        return SEPARATION, f"{kinds}: the odds ratio is {word}; the test's p stands"
    return OK, ""


def fisher_misaligned_vs_neutral(rates: pd.DataFrame, confidence: float = 0.95) -> pd.DataFrame:
    """Fisher exact test of misgendering in misaligned against neutral cells.

    One test per language (and per input voice when `rates` has a voice_gender
    column: the S2S paper's test compares the two cell types within one voice and
    language; without it the two voices are pooled and voice_gender is 'pooled').
    The 2x2 table is misaligned/neutral x misgendered/not. odds_ratio is the
    sample odds ratio ad/bc (inf or 0 with an empty cell); conditional_odds_ratio
    is the conditional maximum-likelihood estimate with its exact CI, both as R's
    fisher.test reports; p_value is two-sided (tables no more probable than the
    observed one, as fisher.test).

    Parameters
    ----------
    rates : DataFrame
        Output of `misgender_rates` (lang, cell_type, n, misgendered; optionally
        voice_gender) of answers without repeats (with repeats:
        `permutation_misaligned_vs_neutral`).
    confidence : float
        Level of the exact CI of the conditional odds ratio.

    Returns
    -------
    DataFrame
        The columns of FISHER_COLUMNS: lang, voice_gender, misaligned_misgendered,
        misaligned_n, neutral_misgendered, neutral_n, odds_ratio,
        conditional_odds_ratio, ci_low, ci_high, p_value (NaN when a cell type has
        no answers), status ('not estimable' then, 'separation' when a zero cell makes
        the conditional odds ratio infinite, zero or undefined) and reason.

    Examples
    --------
    >>> import pandas as pd
    >>> counts = pd.DataFrame({"lang": ["en"] * 3, "cell_type": ["aligned", "neutral", "misaligned"],
    ...                        "n": [20, 20, 20], "misgendered": [1, 2, 9]})
    >>> res = fisher_misaligned_vs_neutral(counts)
    >>> print(res[["lang", "voice_gender", "misaligned_misgendered", "neutral_misgendered"]].to_string(index=False))
    lang voice_gender  misaligned_misgendered  neutral_misgendered
      en       pooled                       9                    2
    >>> cols = ["odds_ratio", "conditional_odds_ratio", "ci_low", "ci_high", "p_value"]
    >>> print(res[cols].round(3).to_string(index=False))
     odds_ratio  conditional_odds_ratio  ci_low  ci_high  p_value
          7.364                   6.994   1.148   78.283    0.031
    """
    from scipy.stats.contingency import odds_ratio as contingency_odds_ratio

    keys = ["lang", "voice_gender"] if "voice_gender" in rates else ["lang"]
    rows = []
    for key, g in rates.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        lang, voice = key[0], (key[1] if len(key) > 1 else "pooled")
        m = g.set_index("cell_type")
        a, n1 = int(m.loc["misaligned", "misgendered"]), int(m.loc["misaligned", "n"])
        c, n0 = int(m.loc["neutral", "misgendered"]), int(m.loc["neutral", "n"])
        row = {
            "lang": lang,
            "voice_gender": voice,
            "misaligned_misgendered": a,
            "misaligned_n": n1,
            "neutral_misgendered": c,
            "neutral_n": n0,
            "odds_ratio": np.nan,
            "conditional_odds_ratio": np.nan,
            "ci_low": np.nan,
            "ci_high": np.nan,
            "p_value": np.nan,
        }
        if min(n1, n0) > 0:
            tab = [[a, n1 - a], [c, n0 - c]]
            with np.errstate(divide="ignore", invalid="ignore"):
                res = stats.fisher_exact(tab)
            cond = contingency_odds_ratio(tab, kind="conditional")
            ci = cond.confidence_interval(confidence_level=confidence)
            row.update(
                odds_ratio=float(res.statistic),
                conditional_odds_ratio=float(cond.statistic),
                ci_low=float(ci.low),
                ci_high=float(ci.high),
                p_value=float(res.pvalue),
            )
        row["status"], row["reason"] = _two_by_two_status(a, n1, c, n0, row["conditional_odds_ratio"])
        rows.append(row)
    return pd.DataFrame(rows, columns=FISHER_COLUMNS)


def misgender_items(df: pd.DataFrame) -> pd.DataFrame:
    """Describe answers with repeats as one row per item (stimulus).

    Columns: the item's keys (system, task, stimulus_id as present), lang, pole,
    voice_gender, n_answers, n_compliant, compliant (some answer names a gender) and
    misgendered, the share of its compliant answers that misgender the input voice (NaN
    when none is compliant).

    Parameters
    ----------
    df : DataFrame
        Describe answers with a sample column: stimulus_id (and system, task), lang,
        pole, voice_gender, judged_gender.

    Returns
    -------
    DataFrame
        One row per item, in the order of its first answer.

    Examples
    --------
    >>> import pandas as pd
    >>> rows = pd.DataFrame({"stimulus_id": ["a"] * 3 + ["b"] * 3, "sample": [0, 1, 2] * 2, "lang": "en",
    ...                      "pole": "feminine", "voice_gender": "male",
    ...                      "judged_gender": ["female", "male", "none", "none", "none", "none"]})
    >>> print(misgender_items(rows)[["stimulus_id", "n_compliant", "compliant", "misgendered"]].to_string(index=False))
    stimulus_id  n_compliant  compliant  misgendered
              a            2       True          0.5
              b            0      False          NaN
    """
    keys = _item_keys(df)
    compliant = df["judged_gender"].isin(["male", "female"])
    d = df.assign(_compliant=compliant, _wrong=compliant & (df["judged_gender"] != df["voice_gender"]))
    g = d.groupby(keys, sort=False)
    out = g[["lang", "pole", "voice_gender"]].first()
    out["n_answers"] = g.size()
    out["n_compliant"] = g["_compliant"].sum().astype(int)
    out["compliant"] = out["n_compliant"] > 0
    out["misgendered"] = g["_wrong"].sum() / out["n_compliant"].where(out["compliant"])
    return out.reset_index()


#: Monte Carlo draws of the item permutation test (permutation_misaligned_vs_neutral)
PERMUTATIONS = 20000


def permutation_misaligned_vs_neutral(
    df: pd.DataFrame, by_voice: bool = False, permutations: int = PERMUTATIONS
) -> pd.DataFrame:
    """Misgendering in misaligned against neutral cells with repeats: an item permutation test.

    Fisher's exact test needs one binary outcome per independent unit; with several
    answers per item the unit is the item and its outcome is its misgendered share
    (`misgender_items`). The test is the permutation test that Fisher's is for binary
    items: under the null the items' outcomes are exchangeable between the two cell
    types, so the labels are permuted over the items (`permutations` Monte Carlo draws,
    seeded by the row's key) and the two-sided p is (1 + #{|T*| >= |T|}) / (1 + draws),
    T the difference of the mean shares (misaligned minus neutral). The answers of an
    item move together, so repeats of one answer add no information. Rows and columns
    as `fisher_misaligned_vs_neutral` (misgendered: sums of item shares; n: items), with
    odds_ratio the sample odds ratio of those sums; conditional_odds_ratio and its exact
    CI exist for counts only and are NaN; `test` names the test.

    Parameters
    ----------
    df : DataFrame
        Describe answers of one system with a sample column (as `misgender_items`).
    by_voice : bool
        One test within each input voice instead of both voices pooled.
    permutations : int
        Monte Carlo draws.

    Returns
    -------
    DataFrame
        The columns of FISHER_COLUMNS and test, one row per language and ALL (x input
        voice with `by_voice`).

    Examples
    --------
    >>> import pandas as pd
    >>> rows = []
    >>> for i in range(8):
    ...     for pole, wrong in (("feminine", 2), ("neutral", 0 if i < 6 else 1)):  # answers wrong of 3
    ...         rows += [{"stimulus_id": f"{pole}{i}", "sample": s, "lang": "en", "pole": pole,
    ...                   "voice_gender": "male", "judged_gender": "female" if s < wrong else "male"}
    ...                  for s in range(3)]
    >>> res = permutation_misaligned_vs_neutral(pd.DataFrame(rows))
    >>> cols = ["lang", "misaligned_misgendered", "misaligned_n", "neutral_n", "p_value"]
    >>> print(res[cols].round(4).to_string(index=False))
    lang  misaligned_misgendered  misaligned_n  neutral_n  p_value
      en                  5.3333             8          8   0.0002
     ALL                  5.3333             8          8   0.0001
    """
    import zlib

    items = misgender_items(df)
    items = items[items["compliant"]].copy()
    items["cell_type"] = [cell_type(p, v) for p, v in zip(items["pole"], items["voice_gender"])]
    system = str(df["system"].iloc[0]) if "system" in df.columns and len(df) else ""
    voices = [("male", "male"), ("female", "female")] if by_voice else [("pooled", None)]
    rows = []
    for lang, g in [*items.groupby("lang"), ("ALL", items)]:
        for label, voice in voices:
            gv = g if voice is None else g[g["voice_gender"] == voice]
            mis = gv.loc[gv["cell_type"] == "misaligned", "misgendered"].to_numpy(float)
            neu = gv.loc[gv["cell_type"] == "neutral", "misgendered"].to_numpy(float)
            a, c, n1, n0 = float(mis.sum()), float(neu.sum()), len(mis), len(neu)
            row = {
                "lang": lang,
                "voice_gender": label,
                "misaligned_misgendered": a,
                "misaligned_n": n1,
                "neutral_misgendered": c,
                "neutral_n": n0,
                "odds_ratio": np.nan,
                "conditional_odds_ratio": np.nan,
                "ci_low": np.nan,
                "ci_high": np.nan,
                "p_value": np.nan,
                "test": f"item permutation ({permutations} draws)",
            }
            if min(n1, n0) > 0:
                with np.errstate(divide="ignore", invalid="ignore"):
                    row["odds_ratio"] = float(np.float64(a * (n0 - c)) / np.float64((n1 - a) * c))
                rng = np.random.default_rng(zlib.crc32(f"{system}|{lang}|{label}|misaligned-vs-neutral".encode()))
                pooled = np.concatenate([mis, neu])
                observed = abs(mis.mean() - neu.mean())
                perm = rng.permuted(np.broadcast_to(pooled, (permutations, len(pooled))), axis=1)
                diffs = np.abs(perm[:, :n1].mean(axis=1) - perm[:, n1:].mean(axis=1))
                row["p_value"] = float((1 + np.sum(diffs >= observed - 1e-12)) / (1 + permutations))
            row["status"], row["reason"] = _two_by_two_status(a, n1, c, n0, row["odds_ratio"])
            rows.append(row)
    return pd.DataFrame(rows, columns=[*FISHER_COLUMNS, "test"])


def _collapse(
    X: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Identical (x, y) rows merged into one whose weight is the sum of theirs.

    The penalised log-likelihood, its score and the information are sums over rows, so
    they are unchanged; the describe design (six covariate patterns, two outcomes) becomes
    at most twelve rows, whatever the number of answers. Rows of weight 0 are dropped.
    """
    X = np.asarray(X, float)
    y = np.asarray(y, float)
    c = np.ones(len(y)) if weights is None else np.asarray(weights, float)
    if len(y) == 0:
        return X, y, c
    rows, inverse = np.unique(np.column_stack([X, y]), axis=0, return_inverse=True)
    w = np.bincount(inverse.ravel(), weights=c, minlength=len(rows))
    keep = w > 0
    return rows[keep, :-1], rows[keep, -1], w[keep]


def _logsumexp(x: np.ndarray) -> float:
    """log sum exp(x) of a short vector (scipy's, built for arrays of any backend, costs more here than
    the whole fit step)."""
    top = float(np.max(x))
    return top + float(np.log(np.sum(np.exp(x - top)))) if np.isfinite(top) else top


class _PenalisedLogit:
    """The Firth-penalised logistic log-likelihood l(b) + 0.5 log|X'WX| of rows merged by `_collapse`,
    with its score, information and Hessian.

    With few covariate patterns (the describe design has six) |X'WX| is taken by the
    Cauchy-Binet formula, |X'WX| = sum over k-subsets T of the patterns of
    prod_{t in T} W_t det(X_T)^2, a sum of positive terms formed in log space
    (log W_t = log c_t - log(1 + e^-eta) - log(1 + e^eta)): nothing cancels or
    underflows however far out on the profile eta goes. The same terms, normalised,
    are the probabilities pi_T of volume sampling, whose inclusion probabilities are the
    hat values (h_r = sum_{T containing r} pi_T, and h_r h_s - sum_{T containing r, s} pi_T
    = H_rs^2, Q Q' = H the hat matrix), so the modified score and the Hessian come from
    them too. With many patterns (more than SUBSETS_LIMIT subsets) the pieces come from
    the QR decomposition of W^1/2 X instead (p and 1 - p each from the logistic function,
    so neither is formed as 1 minus a number near 1).

    The modified score is U* = X'(c (y - p) + h (1/2 - p)), the exact gradient for the
    logit link. With A = (X'WX)^-1, M = X A X', w' = w (q - p) and w'' = w (1 - 6 p q)
    (q = 1 - p), the Hessian of 0.5 log|X'WX| is 0.5 [X' diag(w'' m) X - (w' X)'
    (M o M) (w' X)], that is 0.5 [X' diag((1 - 6 p q) h) X - X' diag(q - p) (H o H)
    diag(q - p) X] (o the elementwise product); the log-likelihood adds -X'WX.
    """

    SUBSETS_LIMIT = 20000

    def __init__(self, X: np.ndarray, y: np.ndarray, c: np.ndarray) -> None:
        import itertools
        from math import comb

        self.X, self.y, self.c = X, y, c
        self.k = X.shape[1]
        self.patterns, self.pattern_of = np.unique(X, axis=0, return_inverse=True)
        self.pattern_of = self.pattern_of.ravel()
        self.weight = np.bincount(self.pattern_of, weights=c, minlength=len(self.patterns))
        m = len(self.patterns)
        self.volume = m >= self.k and comb(m, self.k) <= self.SUBSETS_LIMIT
        if self.volume:
            subsets = np.array(list(itertools.combinations(range(m), self.k)), dtype=int).reshape(-1, self.k)
            det = np.abs(np.linalg.det(self.patterns[subsets])) if len(subsets) else np.zeros(0)
            # a subset of collinear patterns adds nothing (det 0, up to the rounding of det itself)
            keep = det > 1e-10 * max(1.0, float(np.max(np.abs(self.patterns)))) ** self.k
            self.subsets, self.logvol = subsets[keep], 2 * np.log(det[keep])
            self.member = np.zeros((len(self.subsets), m))
            for col in range(self.k):
                self.member[np.arange(len(self.subsets)), self.subsets[:, col]] = 1.0

    def _loglik(self, beta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        from scipy.special import expit

        eta = self.X @ beta
        ll = float(np.sum(self.c * (self.y * eta - np.logaddexp(0.0, eta))))
        return ll, eta, expit(eta), expit(-eta)

    def _log_terms(self, beta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pattern linear predictors and log prod W_t det(X_T)^2 of each subset."""
        eta_r = self.patterns @ beta
        with np.errstate(divide="ignore"):
            logw = np.log(self.weight) - np.logaddexp(0.0, -eta_r) - np.logaddexp(0.0, eta_r)
        return eta_r, logw[self.subsets].sum(axis=1) + self.logvol

    def value(self, beta: np.ndarray) -> float:
        """The penalised log-likelihood at beta (-inf where X'WX is singular)."""
        ll = self._loglik(beta)[0]
        if not self.volume:
            return ll + self._qr(beta)[0]
        if not len(self.subsets):
            return -np.inf
        return ll + 0.5 * _logsumexp(self._log_terms(beta)[1])

    def _qr(self, beta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """0.5 log|X'WX|, the hat matrix and X'WX of the rows from the QR decomposition of W^1/2 X."""
        from scipy.special import expit

        eta = self.X @ beta
        w = self.c * expit(eta) * expit(-eta)
        Q, R = np.linalg.qr(self.X * np.sqrt(w)[:, None])
        d = np.abs(np.diag(R))
        pen = float(np.sum(np.log(d))) if len(d) == self.k and np.all(d > 0) else -np.inf
        return pen, Q @ Q.T, R.T @ R

    def derivatives(self, beta: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """(penalised log-likelihood, modified score U*, information X'WX, Hessian) at beta."""
        from scipy.special import expit

        ll, eta, p, q = self._loglik(beta)
        if self.volume:
            if not len(self.subsets):
                raise NotEstimable("Firth fit: the design is rank deficient")
            eta_r, terms = self._log_terms(beta)
            top = _logsumexp(terms)
            pi = np.exp(terms - top)
            h = pi @ self.member  # inclusion probability of each pattern: its hat value
            H2 = np.outer(h, h) - (self.member * pi[:, None]).T @ self.member
            np.fill_diagonal(H2, h * h)
            Xr, pr, qr = self.patterns, expit(eta_r), expit(-eta_r)
            info = Xr.T @ (Xr * (self.weight * pr * qr)[:, None])
            value = ll + 0.5 * top
        else:
            pen, hat, info = self._qr(beta)
            h, H2, Xr, pr, qr = np.diag(hat), hat**2, self.X, p, q
            value = ll + pen
        # c (y - p) with y - p = y q - (1 - y) p, and h (1/2 - p) = h (q - p) / 2
        score = self.X.T @ (self.c * (self.y * q - (1.0 - self.y) * p)) + Xr.T @ (0.5 * h * (qr - pr))
        Xs = Xr * (qr - pr)[:, None]
        hess = -info + 0.5 * (Xr.T @ (Xr * ((1.0 - 6.0 * pr * qr) * h)[:, None]) - Xs.T @ H2 @ Xs)
        return value, score, info, (hess + hess.T) / 2


def _firth_max(
    model: _PenalisedLogit,
    fixed: dict[int, float] | None = None,
    max_iter: int = 500,
    tol: float = 1e-9,
    start: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    """`firth_fit` of a `_PenalisedLogit`."""
    k = model.k
    fixed = fixed or {}
    free = [j for j in range(k) if j not in fixed]
    beta = np.zeros(k) if start is None else np.array(start, float)
    for j, v in fixed.items():
        beta[j] = v
    current = model.value(beta)
    if not free:
        return beta, current

    def climb(direction: np.ndarray) -> bool:
        nonlocal beta, current
        t = 1.0
        # halve until the step no longer changes beta in the arithmetic
        while t * np.max(np.abs(direction)) > 1e-15 * (1.0 + np.max(np.abs(beta))):
            cand = beta + t * direction
            val = model.value(cand)
            if val > current:
                beta, current = cand, val
                return True
            t /= 2
        return False

    g = np.zeros(len(free))
    polish = 0
    for _ in range(max_iter):
        _, score, info, hess = model.derivatives(beta)
        g = score[free]
        if not (np.all(np.isfinite(g)) and np.all(np.isfinite(hess))):
            raise NotEstimable("Firth fit: the penalised likelihood cannot be evaluated (non-finite score)")
        evals, evecs = np.linalg.eigh(hess[np.ix_(free, free)])
        concave = evals[-1] < -1e-10 * max(1.0, float(np.max(np.abs(evals))))
        ascent = np.zeros(k)
        ascent[free] = evecs[:, -1]
        # converged: a score below tol, or a Newton step below 1e-10 (relative) at a concave point: the
        # score's rounding floor can exceed tol, and the coefficients are then known to that precision
        flat = concave and float(np.max(np.abs((evecs / evals) @ (evecs.T @ g)))) < 1e-10 * max(
            1.0, np.max(np.abs(beta))
        )
        if np.max(np.abs(g)) < tol or flat:
            # at a maximum, or at a saddle point (zero score, a direction of ascent): leave it along that direction
            if concave or not (climb(ascent) or climb(-ascent)):
                return beta, current
            continue
        # Newton with the curvatures taken as |lambda| (the saddle-free Newton step): Newton's step where the
        # penalised likelihood is concave, quadratic convergence near the maximum, and an ascent direction that
        # leaves a saddle elsewhere
        step = np.zeros(k)
        floor = 1e-8 * max(1.0, float(np.max(np.abs(evals))))
        step[free] = (evecs / np.maximum(np.abs(evals), floor)) @ (evecs.T @ g)
        scoring = np.zeros(k)  # Fisher scoring on the modified score: an ascent direction everywhere
        scoring[free] = np.linalg.lstsq(info[np.ix_(free, free)], g, rcond=None)[0]
        grad = np.zeros(k)
        grad[free] = g / max(1.0, float(np.max(np.abs(g))))
        # near a saddle the score is at its rounding floor and no step gains: the ascent direction does
        if not (
            climb(np.clip(step, -5, 5))
            or climb(np.clip(scoring, -5, 5))
            or climb(grad)
            or (not concave and (climb(ascent) or climb(-ascent)))
        ):
            if concave and polish < 5 and np.max(np.abs(step)) < 1e-6 * max(1.0, np.max(np.abs(beta))):
                # the gain left is below the rounding of the likelihood, not of its score (a flat
                # direction under separation): finish with Newton steps on the score equation U* = 0
                beta, current, polish = beta + step, model.value(beta + step), polish + 1
                continue
            # no ascent left at the arithmetic's precision: the maximum, to that precision
            return beta, current
    raise NotEstimable(f"Firth fit did not converge in {max_iter} steps (max |score| {np.max(np.abs(g)):.3g})")


def firth_fit(
    X: np.ndarray,
    y: np.ndarray,
    fixed: dict[int, float] | None = None,
    max_iter: int = 500,
    tol: float = 1e-9,
    start: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    """Maximise the Firth-penalised log-likelihood l(b) + 0.5 log|X'WX| (Firth, 1993).

    Newton steps on the penalised likelihood where it is locally concave (its Hessian in
    closed form, `_PenalisedLogit`), Fisher scoring on the modified score elsewhere
    (Heinze & Schemper, 2002), with step halving so the penalised likelihood never
    decreases. Identical rows are merged first (`_collapse`). `fixed` holds coefficients
    at given values (for the profile likelihood); the penalty always uses the full
    design, as logistf does. The fit has converged when the largest free component of
    the modified score is below `tol` and the penalised likelihood is locally concave
    there; the penalised likelihood need not be concave, and under separation a
    symmetric design can leave a saddle point (zero score, a direction of ascent)
    where a step-size criterion would stop, so from a saddle the search continues
    along the ascent direction of the Hessian. `start` gives starting values (zeros by
    default; fixed entries are overwritten). `weights` weigh the rows (an item's share
    of answers, with repeats). For the logit link the estimate is finite under
    separation whenever X has full rank (the penalty is Jeffreys' prior, which goes to
    0 along every direction).

    Parameters
    ----------
    X : array of shape (n, k)
        Design matrix (with its constant column).
    y : array of shape (n,)
        Binary outcome.
    fixed : dict, optional
        Column index -> value of coefficients held fixed.
    max_iter : int
        Most Newton steps.
    tol : float
        Largest free score component accepted at the maximum.
    start : array of shape (k,), optional
        Starting values.
    weights : array of shape (n,), optional
        Row weights (all 1 by default).

    Returns
    -------
    tuple
        (coefficients, penalised log-likelihood) of the local maximum reached.

    Raises
    ------
    NotEstimable
        If no maximum is reached in `max_iter` steps, or the penalised likelihood
        cannot be evaluated.

    Examples
    --------
    Completely separated data (no maximum-likelihood estimate): the Firth estimate of
    the slope is log 25, the odds ratio of the table with 0.5 added to every cell.

    >>> import numpy as np
    >>> X = np.array([[1, 0], [1, 0], [1, 1], [1, 1]], float)
    >>> beta, loglik = firth_fit(X, np.array([0, 0, 1, 1], float))
    >>> print(np.round(beta, 3), round(loglik, 3))
    [-1.609  3.219] -2.01
    >>> round(float(np.exp(beta[1])), 3)
    25.0
    """
    return _firth_max(_PenalisedLogit(*_collapse(X, y, weights)), fixed=fixed, max_iter=max_iter, tol=tol, start=start)


#: how far from the estimate (log-odds) the profile CI's bounds are searched; beyond it a bound is reported infinite
PROFILE_SEARCH_LIMIT = 1024.0


def firth_coefficient(
    X: np.ndarray, y: np.ndarray, j: int, confidence: float = 0.95, weights: np.ndarray | None = None
) -> dict[str, float]:
    """Firth estimate of coefficient j with profile penalised-likelihood CI and LRT p-value.

    The profile at b_j = v maximises the penalised likelihood over the other coefficients
    from three starts, zeros, the unconstrained estimate and the profile maximum at the
    nearest v already visited, and keeps the highest maximum: under separation the
    constrained surface can have more than one local maximum. The CI is {v : 2 (l*(b) -
    l*_v) <= chi2_1(confidence)}. Each bound is searched by doubling steps out from the
    estimate (0.5, 1, 2, ... up to PROFILE_SEARCH_LIMIT on the log-odds scale), then located
    by Brent's method. A bound is reported infinite (the CI open on that side) when the
    profile does not cross the level within the search limit, or crosses it only where the
    penalised likelihood cannot be evaluated (with many covariate patterns it is taken by
    QR, which underflows at |eta| of several hundred), or the constrained fit cannot be made
    there. For the logit link the profile falls without bound on both sides whenever X has
    full rank, so on the describe design both bounds are finite even under complete
    separation; an open side means the bound lies beyond what can be computed, and the
    interval reported contains the true one. The p-value is NaN when the profile at 0 cannot
    be computed.

    Parameters
    ----------
    X : array of shape (n, k)
        Design matrix (with its constant column).
    y : array of shape (n,)
        Binary outcome.
    j : int
        Column of the coefficient.
    confidence : float
        Level of the profile-likelihood CI.
    weights : array of shape (n,), optional
        Row weights (all 1 by default).

    Returns
    -------
    dict
        coef, ci_low, ci_high (log-odds scale; -inf / +inf for an open side) and
        p_value (penalised LRT of b_j = 0).

    Raises
    ------
    NotEstimable
        If the unconstrained Firth fit cannot be made (`firth_fit`).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.array([[1, 0], [1, 0], [1, 1], [1, 1]], float)
    >>> res = firth_coefficient(X, np.array([0, 0, 1, 1], float), 1)
    >>> {k: round(v, 3) for k, v in res.items()}
    {'coef': 3.219, 'ci_low': -0.431, 'ci_high': 9.124, 'p_value': 0.088}
    """
    model = _PenalisedLogit(*_collapse(X, y, weights))
    beta, ll = _firth_max(model)
    crit = float(stats.chi2.ppf(confidence, 1))
    solutions: dict[float, np.ndarray] = {}

    def dev(v: float) -> tuple[float, float]:
        """2 (l* - l*_v) - crit and its derivative in v, -2 U*_j at the profile maximum (the
        envelope theorem); +inf where the penalised likelihood underflows, NaN where no
        constrained fit was made."""
        starts = [np.zeros(len(beta)), beta]
        if solutions:
            starts.append(solutions[min(solutions, key=lambda u: abs(u - v))])
        best: tuple[np.ndarray, float] | None = None
        for s in starts:
            try:
                fit = _firth_max(model, fixed={j: v}, start=s)
            except NotEstimable:
                continue
            if best is None or fit[1] > best[1]:
                best = fit
        if best is None:
            return float("nan"), float("nan")
        solutions[v] = best[0]
        slope = -2 * float(model.derivatives(best[0])[1][j]) if np.isfinite(best[1]) else float("nan")
        return 2 * (ll - best[1]) - crit, slope

    def crossing(lo: float, hi: float, f_lo: float) -> float:
        """The root of dev in [lo, hi] (dev(lo) = f_lo, of the other sign than dev(hi)) by Newton
        steps kept inside the bracket (bisection where a step leaves it or dev is infinite)."""
        x = (lo + hi) / 2
        for _ in range(200):
            fx, dfx = dev(x)
            if fx == 0 or np.isnan(fx):
                return x
            if (fx > 0) == (f_lo > 0):
                lo, f_lo = x, fx
            else:
                hi = x
            newton = x - fx / dfx if np.isfinite(fx) and np.isfinite(dfx) and dfx != 0 else np.nan
            if abs(hi - lo) < 1e-12 * max(1.0, abs(x)) or (
                np.isfinite(newton) and abs(newton - x) < 1e-12 * max(1.0, abs(x))
            ):
                return newton if np.isfinite(newton) and min(lo, hi) <= newton <= max(lo, hi) else x
            x = newton if np.isfinite(newton) and min(lo, hi) < newton < max(lo, hi) else (lo + hi) / 2
        return x

    b = float(beta[j])
    at_zero = dev(0.0)[0] + crit
    p = float(stats.chi2.sf(max(0.0, at_zero), 1)) if np.isfinite(at_zero) else float("nan")
    bounds = []
    for direction in (-1, 1):
        bound, inner, f_inner, step = direction * np.inf, b, -crit, 0.5
        while step <= PROFILE_SEARCH_LIMIT:
            far = b + direction * step
            d_far = dev(far)[0]
            if np.isnan(d_far):
                break
            if d_far > 0:
                root = crossing(inner, far, f_inner)
                if abs(dev(root)[0]) < 1e-6:  # a crossing, not the edge where the likelihood underflows
                    bound = root
                break
            inner, f_inner, step = far, d_far, step * 2
        bounds.append(float(bound))
    return {"coef": b, "ci_low": bounds[0], "ci_high": bounds[1], "p_value": p}
