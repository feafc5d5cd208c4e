"""The audit card: one page per pipeline run with the run's verdicts, each from a written rule.

`audit_card` is a pure function of the analysis tables (reports/analysis, reports/sc), the two
check metrics (carrier gate, phonation manipulation check) and a provenance dict passed in; it
returns a JSON-able dict. `render_card_md` renders that dict with templates/audit_card.md.j2,
`card_tables` gives the same content as the report's card tables. The rules are the small
functions below (`invariance_verdict`, `drift_fit_verdict`, `drift_verdict`, `recovered`) with
their thresholds as named constants; docs/audit-card.md derives the thresholds from the design.
The verdict words are the constants `VERDICTS` and `DRIFT_VERDICTS`, never free text.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

from voicebias.analysis.intervals import newcombe_difference, wilson
from voicebias.contract import CELL_KEYS
from voicebias.cost import TOTAL_COUNTS
from voicebias.io import read_table
from voicebias.report.build import _template_env, section_texts

# --- thresholds (docs/audit-card.md) -------------------------------------------------------------
#: the planted error rate e of the reference systems (params.yaml systems.*.error_rate): the design's
#: unit for "how strongly can content move the answer".
DESIGN_ERROR_RATE = 0.05
#: OR per content step of a system that decides from the voice alone (content weight 0).
VOICE_FAITHFUL_OR = 1.0
#: a fully content-driven system (content weight 1) has log OR per step log((1 - e) / e); a system is
#: content-driven when its OR is at least this fraction of that, on the log scale.
CONTENT_DRIVEN_LOG_FRACTION = 0.75


def content_driven_min_or(
    error_rate: float = DESIGN_ERROR_RATE, log_fraction: float = CONTENT_DRIVEN_LOG_FRACTION
) -> float:
    """Lower edge of the content-driven region, in OR units: ((1 - e) / e) ** fraction."""
    return float(((1 - error_rate) / error_rate) ** log_fraction)


#: 19 ** 0.75 = 9.10 with e = 0.05.
CONTENT_DRIVEN_MIN_OR = content_driven_min_or()
#: drift smaller than the F0 instrument's accuracy (1 % of F0, in semitones) is not drift the audit can
#: tell from measurement error; the same value as voicebias.analysis.s2s.F0_TOLERANCE_ST (a test checks).
DRIFT_MARGIN_ST = float(12 * math.log2(1.01))
#: the RQ1 F0 measures, preferred first: net (output minus its text-matched control), else delta.
DRIFT_MEASURES = ("net_f0_median_st", "delta_f0_median_st")

VOICE_FAITHFUL, CONTENT_DRIVEN, MIXED, INCONCLUSIVE = "voice-faithful", "content-driven", "mixed", "inconclusive"
VERDICTS = (VOICE_FAITHFUL, CONTENT_DRIVEN, MIXED, INCONCLUSIVE)
TOWARD, AWAY, NO_DRIFT = "drifting toward the stereotype", "drifting away from the stereotype", "no drift detected"
DRIFT_VERDICTS = (TOWARD, AWAY, NO_DRIFT, INCONCLUSIVE)
FIT_TOWARD, FIT_AWAY, FIT_NONE = "toward", "away", "no drift"
FIT_INCONCLUSIVE, FIT_UNUSABLE = "inconclusive", "unusable"
PASSED, FAILED, NOT_RUN = "passed", "failed", "not run"


def _finite(*values: Any) -> bool:
    try:
        return all(v is not None and not math.isnan(float(v)) for v in values)
    except (TypeError, ValueError):
        return False


def _num(v: Any) -> float | None:
    """A finite float, or None (JSON null: not estimable)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


# --- rules ---------------------------------------------------------------------------------------


def invariance_verdict(ci_low: Any, ci_high: Any, content_min_or: float = CONTENT_DRIVEN_MIN_OR) -> str:
    """Describe's verdict from the 95 % CI of the OR per content step (closed interval, OR units).

    content-driven: ci_low >= content_min_or (the CI lies wholly in the content-driven region);
    voice-faithful: ci_low <= 1 <= ci_high and ci_high < content_min_or;
    mixed:          1 < ci_low and ci_high < content_min_or;
    inconclusive:   otherwise (no finite CI, a CI reaching into two regions, a CI wholly below 1).
    A bound equal to a threshold reaches it (a CI touching content_min_or from below is inconclusive).
    """
    if not _finite(ci_low) or ci_high is None or (isinstance(ci_high, float) and math.isnan(ci_high)):
        return INCONCLUSIVE
    lo, hi = float(ci_low), float(ci_high)
    if lo > hi:
        return INCONCLUSIVE
    if lo >= content_min_or:
        return CONTENT_DRIVEN
    if hi >= content_min_or:
        return INCONCLUSIVE
    if lo <= VOICE_FAITHFUL_OR <= hi:
        return VOICE_FAITHFUL
    if lo > VOICE_FAITHFUL_OR:
        return MIXED
    return INCONCLUSIVE


def odds_estimate(row: dict[str, Any] | pd.Series) -> dict[str, Any]:
    """The OR per step used for the verdict: the Wald fit when its status is 'ok' and its CI finite, else
    the Firth (penalised) fit when the table has one with a finite lower bound (perfect separation), else
    none. Returns odds_ratio, ci_low, ci_high and source ('wald', 'firth' or None)."""
    r = dict(row)
    if str(r.get("fit_status")) == "ok" and _finite(r.get("odds_ratio"), r.get("ci_low"), r.get("ci_high")):
        return {
            "odds_ratio": _num(r["odds_ratio"]),
            "ci_low": _num(r["ci_low"]),
            "ci_high": _num(r["ci_high"]),
            "source": "wald",
        }
    if (
        _finite(r.get("firth_ci_low"))
        and r.get("firth_ci_high") is not None
        and not (isinstance(r.get("firth_ci_high"), float) and math.isnan(r["firth_ci_high"]))
    ):
        hi = float(r["firth_ci_high"])
        return {
            "odds_ratio": _num(r.get("firth_odds_ratio")),
            "ci_low": _num(r["firth_ci_low"]),
            "ci_high": hi if math.isfinite(hi) else math.inf,
            "source": "firth",
        }
    return {"odds_ratio": None, "ci_low": None, "ci_high": None, "source": None}


def mixed_odds_estimate(glmm: pd.DataFrame | None, system: str) -> dict[str, Any]:
    """The OR per content step of the describe mixed model (describe_glmm.csv, lang ALL), used for the
    verdict when its status is 'ok' and its CI finite: odds_ratio, ci_low, ci_high, source ('mixed' or
    None) and generalises_over (what the passages and voices random effects let the estimate hold over)."""
    none = {"odds_ratio": None, "ci_low": None, "ci_high": None, "source": None, "generalises_over": None}
    if glmm is None or not len(glmm):
        return none
    g = glmm[(glmm["system"] == system) & (glmm["lang"] == "ALL")].set_index("term")
    if "content_step" not in g.index:
        return none
    r = g.loc["content_step"]
    if r["status"] != "ok" or not _finite(r["odds_ratio"], r["ci_low"], r["ci_high"]):
        return none
    over = [str(r["generalises_over"])]
    if "voice_female" in g.index:
        over.append(str(g.loc["voice_female", "generalises_over"]))
    return {
        "odds_ratio": _num(r["odds_ratio"]),
        "ci_low": _num(r["ci_low"]),
        "ci_high": _num(r["ci_high"]),
        "source": "mixed",
        "generalises_over": "; ".join(x for x in over if x and x != "nan"),
    }


def drift_fit_verdict(ci_low: Any, ci_high: Any, margin: float = DRIFT_MARGIN_ST) -> str:
    """One language x task fit's verdict from the 95 % CI of the stereotype-signed F0 effect (st, closed).

    toward: ci_low >= margin; away: ci_high <= -margin; no drift: -margin < ci_low and ci_high < margin;
    inconclusive otherwise (the CI reaches from the no-drift band into a drift region, or is not finite).
    """
    if not _finite(ci_low, ci_high) or float(ci_low) > float(ci_high):
        return FIT_INCONCLUSIVE
    lo, hi = float(ci_low), float(ci_high)
    if lo >= margin:
        return FIT_TOWARD
    if hi <= -margin:
        return FIT_AWAY
    if -margin < lo and hi < margin:
        return FIT_NONE
    return FIT_INCONCLUSIVE


def fit_usable(row: dict[str, Any] | pd.Series) -> bool:
    """A mixed-model fit counts when its estimate and CI are finite and it converged, or when its
    warning says the measure has no variance (every output the same: the effect is exact, CI a point)."""
    r = dict(row)
    if not _finite(*(r.get(f"stereotype_effect_{k}") for k in ("est", "ci_low", "ci_high"))):
        return False
    converged = r.get("converged")
    converged = str(converged).strip().lower() == "true" if isinstance(converged, str) else bool(converged)
    return converged or str(r.get("warning", "")).startswith("no variance")


def drift_verdict(fit_verdicts: Iterable[str]) -> str:
    """A system's RQ1 verdict over its usable language x task fits ('unusable' ones are left out):

    drifting toward (away from) the stereotype: at least one fit 'toward' ('away') and none the other way;
    no drift detected: every usable fit 'no drift' (and there is at least one);
    inconclusive: otherwise (no usable fit, fits in both directions, or an inconclusive fit and no drift).
    """
    v = [f for f in fit_verdicts if f != FIT_UNUSABLE]
    toward, away = FIT_TOWARD in v, FIT_AWAY in v
    if toward and not away:
        return TOWARD
    if away and not toward:
        return AWAY
    if v and all(f == FIT_NONE for f in v):
        return NO_DRIFT
    return INCONCLUSIVE


def recovered(row: dict[str, Any] | pd.Series) -> bool:
    """A planted quantity is recovered when its planted value lies in its simultaneous interval
    (planted_in_simultaneous_ci: a system's intervals in the table at the Bonferroni coverage over
    the values it checks; a row outside that family, or a table without one, uses its own CI, planted_in_ci), or
    the estimate is within the stated tolerance (within_tolerance), or the SC table says so
    (recovered_ok)."""
    r = dict(row)
    simultaneous = r.get("planted_in_simultaneous_ci")
    in_ci = r.get("planted_in_ci") if _missing(simultaneous) else simultaneous
    return any(_true(v) for v in (in_ci, r.get("within_tolerance"), r.get("recovered_ok")))


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v.strip())


def gate_verdict(metrics: dict[str, Any] | None) -> str:
    """passed / failed from a check's metrics json ('passed' key); 'not run' when there are no metrics."""
    if not metrics or "passed" not in metrics:
        return NOT_RUN
    return PASSED if _true(metrics["passed"]) else FAILED


def _true(v: Any) -> bool:
    if isinstance(v, str):
        return v.strip().lower() == "true"
    return not _missing(v) and bool(v)


# --- the card ------------------------------------------------------------------------------------


def _read(path: Path) -> pd.DataFrame | None:
    return read_table(path) if Path(path).exists() else None


def _rate(rates: pd.DataFrame, cell: str) -> dict[str, Any]:
    r = rates[rates["cell_type"] == cell]
    if r.empty:
        return {"rate": None, "ci_low": None, "ci_high": None, "misgendered": None, "n": None}
    r = r.iloc[0]
    # with repeats misgendered is a sum of item shares (voicebias.analysis.stats.misgender_rates), not a count
    k, n = float(r["misgendered"]), int(r["n"])
    k = int(k) if k.is_integer() else k
    if "ci_low" in r and "ci_high" in r and _finite(r["ci_low"], r["ci_high"]):
        lo, hi = float(r["ci_low"]), float(r["ci_high"])
    else:
        lo, hi = wilson(k, n)
    return {
        "rate": _num(r["rate"]) if "rate" in r else (k / n if n else None),
        "ci_low": _num(lo),
        "ci_high": _num(hi),
        "misgendered": k,
        "n": n,
    }


def _misgender(rates: pd.DataFrame | None, system: str) -> dict[str, Any]:
    if rates is None:
        return {}
    d = rates[(rates["system"] == system) & (rates["lang"] == "ALL")]
    mis, ali = _rate(d, "misaligned"), _rate(d, "aligned")
    out: dict[str, Any] = {
        "misaligned": mis,
        "aligned": ali,
        "difference_pp": {"est": None, "ci_low": None, "ci_high": None},
    }
    if all(_finite(x[k]) for x in (mis, ali) for k in ("rate", "ci_low", "ci_high")):
        d_, lo, hi = newcombe_difference(
            mis["rate"], mis["ci_low"], mis["ci_high"], ali["rate"], ali["ci_low"], ali["ci_high"]
        )
        out["difference_pp"] = {"est": 100 * d_, "ci_low": 100 * lo, "ci_high": 100 * hi}
    return out


def _summarize(pron: pd.DataFrame | None, system: str) -> dict[str, Any] | None:
    if pron is None:
        return None
    d = pron[pron["system"] == system]
    if "lang" in d:
        d = d[d["lang"] == "ALL"]
    if d.empty or "delta_pp" not in d:
        return None
    r = d.iloc[0]
    lo = next((r[c] for c in ("delta_pp_ci_low", "ci_low") if c in r), None)
    hi = next((r[c] for c in ("delta_pp_ci_high", "ci_high") if c in r), None)
    return {"delta_pp": _num(r["delta_pp"]), "ci_low": _num(lo), "ci_high": _num(hi)}


def _drift(mixed: pd.DataFrame | None, system: str, margin: float) -> dict[str, Any]:
    none = {
        "verdict": INCONCLUSIVE,
        "measure": None,
        "margin_st": margin,
        "n_fits": 0,
        "fits": {k: 0 for k in (FIT_TOWARD, FIT_AWAY, FIT_NONE, FIT_INCONCLUSIVE, FIT_UNUSABLE)},
        "est_min": None,
        "est_max": None,
        "ci_low_min": None,
        "ci_high_max": None,
        "generalises_over": None,
    }
    if mixed is None:
        return none
    d = mixed[mixed["system"] == system]
    measure = next((m for m in DRIFT_MEASURES if (d["measure"] == m).any()), None)
    if measure is None:
        return none
    d = d[d["measure"] == measure]
    verdicts, usable = [], []
    for r in d.to_dict("records"):
        if fit_usable(r):
            usable.append(r)
            verdicts.append(drift_fit_verdict(r["stereotype_effect_ci_low"], r["stereotype_effect_ci_high"], margin))
        else:
            verdicts.append(FIT_UNUSABLE)
    counts = {k: verdicts.count(k) for k in none["fits"]}
    est = [float(r["stereotype_effect_est"]) for r in usable]
    return {
        "verdict": drift_verdict(verdicts),
        "measure": measure,
        "margin_st": margin,
        "n_fits": len(verdicts),
        "fits": counts,
        "est_min": min(est) if est else None,
        "est_max": max(est) if est else None,
        "ci_low_min": min(float(r["stereotype_effect_ci_low"]) for r in usable) if usable else None,
        "ci_high_max": max(float(r["stereotype_effect_ci_high"]) for r in usable) if usable else None,
        "generalises_over": _rq1_scope(usable),
    }


def _rq1_scope(fits: list[dict[str, Any]]) -> str | None:
    """What the usable RQ1 fits hold over: passages, and voices when every fit has the voice intercept."""
    if not fits:
        return None
    if all(str(r.get("random_effects")) == "passage + voice" for r in fits):
        n = min(int(r["voices_per_gender"]) for r in fits)
        return f"passages and {n} voices per gender (random)"
    return "passages (random); these voices"


def _concat(*tables: pd.DataFrame | None) -> pd.DataFrame | None:
    present = [t for t in tables if t is not None and len(t)]
    return pd.concat(present, ignore_index=True) if present else next((t for t in tables if t is not None), None)


def _planted(pvr: pd.DataFrame | None) -> dict[str, Any] | None:
    if pvr is None:
        return None
    rows = pvr.to_dict("records")
    missed = [f"{r['system']}: {r['quantity']}" for r in rows if not recovered(r)]
    # the values each outside its own CI: about 1 - confidence of those checked by an interval, by chance
    outside = [
        f"{r['system']}: {r['quantity']}"
        for r in rows
        if not _missing(r.get("planted_in_ci")) and not _true(r["planted_in_ci"])
    ]
    return {
        "n": len(rows),
        "recovered": len(rows) - len(missed),
        "not_recovered": missed,
        "outside_own_ci": outside,
    }


def _excluded_by_reason(excluded: pd.DataFrame | None, system: str) -> dict[str, int]:
    """Replies the screen or the instrument excluded, by reason (exclusions.csv; failed calls and
    non-compliant answers have their own columns), in reason order."""
    if excluded is None:
        return {}
    g = excluded[(excluded["system"] == system) & ~excluded["reason"].isin(["call_failed", "non_compliant"])]
    return {str(k): int(v) for k, v in g.groupby("reason")["n"].sum().sort_index().items()}


def audit_card(
    analysis_dir: Path,
    sc_dir: Path | None,
    gate_metrics: dict[str, Any] | None,
    check_metrics: dict[str, Any] | None,
    provenance: dict[str, Any],
    content_min_or: float = CONTENT_DRIVEN_MIN_OR,
    drift_margin_st: float = DRIFT_MARGIN_ST,
    voices: dict[str, Any] | None = None,
    psychometric: pd.DataFrame | None = None,
    usage: pd.DataFrame | None = None,
    determinism: dict[str, dict[str, Any]] | None = None,
    samples_per_item: int = 1,
    replicates: pd.DataFrame | None = None,
) -> dict[str, Any]:
    """The audit card of one run, from its tables alone (no clock, no environment): a JSON-able dict.

    S2S systems are those of describe_odds_ratios.csv; continuation systems those of sc/retention.csv.
    Tables that are absent leave their entries empty (None) rather than failing. `voices`
    (`voice_design`) names the voices each study's stimuli are read in. `psychometric`
    (reports/psychometric/psychometric.csv) gives each S2S system its voice-continuum row
    (`continuum_shift`). `usage` (reports/usage/usage.csv) gives each system's calls, audio,
    tokens and cost over the run (`usage_entries`). `determinism` ({system: {task: probe counts}},
    the respond records) gives each probed system its run-to-run agreement (`determinism_entry`).
    `replicates` (every system's reports/replicates/<system>/spread.csv, with run 0's item intervals:
    `with_item_intervals`) gives each cell's spread over whole-run replicates (`replicate_entries`).
    """
    analysis_dir = Path(analysis_dir)
    odds = read_table(analysis_dir / "describe_odds_ratios.csv")
    rates = _read(analysis_dir / "describe_misgender.csv")
    pron = _read(analysis_dir / "summarize_pronouns.csv")
    mixed = _read(analysis_dir / "rq1_mixed_models.csv")
    comp = _read(analysis_dir / "compliance.csv")
    excluded = _read(analysis_dir / "exclusions.csv")
    glmm = _read(analysis_dir / "describe_glmm.csv")
    s2s = []
    for system in dict.fromkeys(odds["system"]):
        o = odds[(odds["system"] == system) & (odds["lang"] == "ALL")]
        row = o.iloc[0].to_dict() if len(o) else {}
        paper = odds_estimate(row)
        mixed_est = mixed_odds_estimate(glmm, system)
        est = mixed_est if mixed_est["source"] is not None else paper
        entry = {
            "system": system,
            "invariance": {
                "verdict": invariance_verdict(est["ci_low"], est["ci_high"], content_min_or),
                **est,
                "generalises_over": mixed_est["generalises_over"]
                if mixed_est["source"] is not None
                else "these voices and passages (fixed)",
                "paper": paper,
                "fit_status": row.get("fit_status"),
                "n": _num(row.get("n")),
                "n_excluded": _num(row.get("n_excluded")),
            },
            "misgender": _misgender(rates, system),
            "summarize": _summarize(pron, system),
            "drift": _drift(mixed, system, drift_margin_st),
            "continuum": {task: continuum_shift(psychometric, system, task) for task in ("describe", "summarize")},
        }
        s2s.append(entry)
    exclusions: dict[str, Any] = {
        "s2s": {},
        "sc": {},
        "carrier_gate_excluded_stimuli": (gate_metrics or {}).get("excluded_stimuli"),
        "phonation_excluded": (check_metrics or {}).get("excluded"),
        "phonation_excluded_by_reason": (check_metrics or {}).get("excluded_by_reason"),
    }
    if comp is not None:
        for system, g in comp.groupby("system", sort=False):
            describe = g[g["task"] == "describe"] if "task" in g else g
            exclusions["s2s"][system] = {
                "calls": int(g["n"].sum()),
                "failed": int(g["failed"].sum()),
                "non_compliant": int(g["non_compliant"].sum()),
                "describe_calls": int(describe["n"].sum()),
                "excluded": _excluded_by_reason(excluded, system),
            }
    sc: list[dict[str, Any]] = []
    sc_pvr = None
    if sc_dir is not None:
        sc_dir = Path(sc_dir)
        ret = _read(sc_dir / "retention.csv")
        success = _read(sc_dir / "success.csv")
        sc_pvr = _read(sc_dir / "planted_vs_recovered.csv")
        if ret is not None:
            for system, g in ret.groupby("system", sort=False):
                sc.append(
                    {
                        "system": system,
                        "retention": [
                            {
                                "voice_gender": r["voice_gender"],
                                "measure": r["measure"],
                                "retention": _num(r["retention"]),
                                "ci_low": _num(r["ci_low"]),
                                "ci_high": _num(r["ci_high"]),
                                "n_prompts": _num(r.get("n_prompts")),
                            }
                            for r in g.to_dict("records")
                        ],
                    }
                )
        if success is not None:
            for r in success.to_dict("records"):
                exclusions["sc"][r["system"]] = {
                    "prompts": int(r["n"]),
                    "succeeded": int(r["succeeded"]),
                    "failed": int(r["n"]) - int(r["succeeded"]),
                }
    return {
        "rules": {
            "doc": "docs/audit-card.md",
            "design_error_rate": DESIGN_ERROR_RATE,
            "voice_faithful_or": VOICE_FAITHFUL_OR,
            "content_driven_min_or": content_min_or,
            "drift_margin_st": drift_margin_st,
            "drift_measures": list(DRIFT_MEASURES),
        },
        "s2s": s2s,
        "sc": sc,
        "checks": {
            "carrier_gate": {
                "verdict": gate_verdict(gate_metrics),
                **{k: (gate_metrics or {}).get(k) for k in ("flips", "excluded_stimuli")},
            },
            "manipulation_check": {
                "verdict": gate_verdict(check_metrics),
                **{
                    k: (check_metrics or {}).get(k)
                    for k in ("checked_cells", "wrong_direction", "classifier_flips", "excluded")
                },
            },
        },
        "planted_vs_recovered": {
            "s2s": _planted(
                _concat(
                    _read(analysis_dir / "planted_vs_recovered.csv"), _read(analysis_dir / "planted_exclusions.csv")
                )
            ),
            "sc": _planted(sc_pvr),
        },
        "exclusions": exclusions,
        "voices": voices or {"s2s": [], "sc": []},
        "compliance": compliance_entries(comp),
        "usage": usage_entries(usage),
        "determinism": [
            determinism_entry(system, tasks, samples_per_item) for system, tasks in (determinism or {}).items()
        ],
        "replicates": replicate_entries(replicates),
        "provenance": dict(provenance),
    }


#: the (metric, condition factor) pairs of the replicates' cells the card shows, pooled over languages:
#: describe's misgender rates by cell type (the S2S paper's cells), every other metric by content pole
CARD_REPLICATE_CELLS = (
    ("misgender_rate", "cell_type"),
    ("injection_rate", "content_pole"),
    ("p_she", "content_pole"),
    *((m, "content_pole") for m in ("delta_composite", "net_composite", "delta_f0_median_st", "net_f0_median_st")),
)
REPLICATE_FIELDS = ("n", "estimate", "ci_low", "ci_high", "replicates", "min", "median", "max", "sd", "cv")


def with_item_intervals(spread: pd.DataFrame, disaggregated: pd.DataFrame | None) -> pd.DataFrame:
    """The replicates' spread table with run 0's item interval of each cell (`ci_low`, `ci_high`) from
    the disaggregated table; NaN for a cell it does not have."""
    out = spread.copy()
    if disaggregated is None or not len(disaggregated) or not len(out):
        return out.assign(ci_low=np.nan, ci_high=np.nan)
    keys = list(CELL_KEYS)
    ci = disaggregated[[*keys, "ci_low", "ci_high"]].drop_duplicates(subset=keys)
    return out.astype({k: str for k in keys}).merge(
        ci.astype({k: str for k in keys}), on=keys, how="left", validate="one_to_one"
    )


def replicate_entries(spread: pd.DataFrame | None) -> list[dict[str, Any]]:
    """One entry per cell the card shows (CARD_REPLICATE_CELLS, all languages pooled) of the
    replicates' spread table: run 0's estimate and item interval, and the runs' min, median, max, SD
    and CV."""
    if spread is None or not len(spread):
        return []
    keep = spread[spread["lang"] == "ALL"]
    keep = keep[[(m, f) in CARD_REPLICATE_CELLS for m, f in zip(keep["metric"], keep["condition_factor"])]]
    out = []
    for r in keep.to_dict("records"):
        entry = {k: r[k] for k in ("system", "task", "metric", "voice_gender", "condition")}
        entry.update({k: _num(r.get(k)) for k in REPLICATE_FIELDS})
        out.append(entry)
    return out


def compliance_entries(comp: pd.DataFrame | None) -> list[dict[str, Any]]:
    """Per S2S system x task, all languages pooled (analysis/compliance.csv): the share of calls that
    failed (errors, and refusals: a reply without audio, with the model's words as its reason) and,
    for describe, the share of answered replies that name no gender (non-compliant), each with its
    95 % Wilson interval."""
    if comp is None or not len(comp):
        return []
    out = []
    for (system, task), g in comp.groupby(["system", "task"], sort=False):
        n, failed = int(g["n"].sum()), int(g["failed"].sum())
        answered = n - failed - (int(g["excluded"].sum()) if "excluded" in g else 0)
        nc = int(g["non_compliant"].sum())
        f_lo, f_hi = wilson(failed, n) if n else (None, None)
        entry: dict[str, Any] = {
            "system": system,
            "task": task,
            "calls": n,
            "failed": failed,
            "failed_rate": failed / n if n else None,
            "failed_ci": [_num(f_lo), _num(f_hi)],
            "answered": answered,
            "non_compliant": nc if task == "describe" else None,
            "non_compliant_rate": nc / answered if task == "describe" and answered else None,
            "non_compliant_ci": [None, None],
        }
        if task == "describe" and answered:
            lo, hi = wilson(nc, answered)
            entry["non_compliant_ci"] = [_num(lo), _num(hi)]
        out.append(entry)
    return out


def determinism_entry(system: str, tasks: dict[str, Any], samples_per_item: int) -> dict[str, Any]:
    """A probed system's agreement per task and its verdict: "deterministic" when every answered
    probe gave the same text and audio again, else "not deterministic", with what the analyses
    then need (`samples_per_item` > 1, docs/repeats.md); "not probed" when no probe was answered."""
    answered = {t: d for t, d in tasks.items() if d.get("agreement") is not None}
    if not answered:
        verdict, note = "not probed", "no probe request was answered"
    elif all(d["agree"] == d["items"] - d.get("failed", 0) for d in answered.values()):
        verdict, note = "deterministic", "the same request gave the same text and audio"
    else:
        verdict = "not deterministic"
        note = (
            f"answers vary from run to run: run.samples_per_item is {samples_per_item}, and the analyses "
            "need more than 1 answer per item (docs/repeats.md)"
            if samples_per_item < 2
            else f"answers vary from run to run; each item has {samples_per_item} answers (docs/repeats.md)"
        )
    return {
        "system": system,
        "verdict": verdict,
        "note": note,
        "needs_samples": verdict == "not deterministic" and samples_per_item < 2,
        "tasks": {t: dict(d) for t, d in sorted(tasks.items())},
    }


#: the per-system totals the card keeps from reports/usage/usage.csv
USAGE_FIELDS = (*TOTAL_COUNTS, "currency", "price_date", "price_source", "model_ids", "fingerprints")


def usage_entries(usage: pd.DataFrame | None) -> list[dict[str, Any]]:
    """One entry per system: its totals over all its calls (the rows with part ALL)."""
    if usage is None or not len(usage):
        return []
    rows = usage[(usage["part"] == "ALL") & (usage["task"] == "ALL")]
    out = []
    for r in rows.to_dict("records"):
        entry: dict[str, Any] = {"system": r["system"]}
        for k in USAGE_FIELDS:
            v = r.get(k)
            v = v.item() if hasattr(v, "item") else v  # numpy scalars as Python numbers (JSON)
            if isinstance(v, float) and math.isnan(v):
                v = None
            elif isinstance(v, float) and v.is_integer() and k.endswith(("calls", "tokens")):
                v = int(v)
            entry[k] = v
        out.append(entry)
    return out


def _tokens_cell(u: dict[str, Any], side: str) -> str:
    """'<total> (<text> / <audio>)', or '–' when no call reported usage."""
    total = u.get(f"{side}_tokens")
    if total is None or not u.get("calls_with_usage"):
        return "–"
    text, audio = u.get(f"{side}_text_tokens"), u.get(f"{side}_audio_tokens")
    split = f" ({_f(text, 0)} / {_f(audio, 0)})" if text is not None or audio is not None else ""
    return f"{_f(total, 0)}{split}"


def _cost_cell(u: dict[str, Any]) -> str:
    if u.get("cost") is None:
        return "– (no price table in the system card)"
    unpriced = int(u.get("calls") or 0) - int(u.get("priced_calls") or 0)
    note = f"; {unpriced} call(s) unpriced (no token split)" if unpriced else ""
    return f"{u['cost']:.4f} {u['currency']} (prices of {u['price_date']}{note})"


def continuum_shift(table: pd.DataFrame | None, system: str, task: str) -> dict[str, Any] | None:
    """One system x task's pooled voice-continuum result for the card: the content's shift of the
    boundary in st with its CI, the slope, and a sentence ("content shifts the boundary by X st
    [CI]", or why there is no boundary). None when the run has no continuum answers for it."""
    if table is None or not len(table):
        return None
    g = table[(table["system"] == system) & (table["task"] == task) & (table["lang"] == "ALL")]
    if not len(g):
        return None
    slope = g[g["quantity"] == "slope"].iloc[0]
    shift = g[g["quantity"] == "shift"].iloc[0]
    out = {
        "shift_st": _num(shift["estimate"]),
        "ci_low": _num(shift["ci_low"]),
        "ci_high": _num(shift["ci_high"]),
        "p_value": _num(shift["p_value"]),
        "slope_per_st": _num(slope["estimate"]),
        "slope_ci_low": _num(slope["ci_low"]),
        "slope_ci_high": _num(slope["ci_high"]),
        "status": str(shift["status"]),
    }
    if slope["status"] != "ok":
        out["sentence"] = f"no estimate ({slope['status']})"
    elif not _true(slope["follows_voice"]):
        out["sentence"] = (
            f"does not follow the voice (slope {_ci(slope['estimate'], slope['ci_low'], slope['ci_high'])} per st)"
        )
    elif out["ci_low"] is None:
        out["sentence"] = f"content shifts the boundary by {_f(out['shift_st'])} st (no CI)"
    else:
        out["sentence"] = f"content shifts the boundary by {_ci(out['shift_st'], out['ci_low'], out['ci_high'])} st"
    return out


def voice_design(certificates: pd.DataFrame | None, sc_voices: dict[str, list[str]] | None) -> dict[str, Any]:
    """The voices of the run, for the card: per language and gender the S2S input voices with how
    many the carrier gate certified (reports/carrier_gate/voices.csv), and the SC prompt voices.

    >>> cert = pd.DataFrame({"lang": ["en", "en"], "phonation": "all", "voice_gender": ["male", "male"],
    ...                      "voice_id": ["en+m1", "en+m2"], "verdict": ["pass", "negligible"]})
    >>> voice_design(cert, {"male": ["en-us+m3"], "female": ["en-us+f3"]})["s2s"]
    [{'lang': 'en', 'voice_gender': 'male', 'voices': ['en+m1', 'en+m2'], 'certified': 2}]
    """
    s2s = []
    if certificates is not None and len(certificates):
        c = certificates[certificates["phonation"].astype(str) == "all"]
        for (lang, gender), g in c.groupby(["lang", "voice_gender"], sort=True):
            s2s.append(
                {
                    "lang": lang,
                    "voice_gender": gender,
                    "voices": sorted(g["voice_id"].astype(str)),
                    "certified": int(g["verdict"].isin(("pass", "benign", "negligible")).sum()),
                }
            )
    sc = [{"voice_gender": g, "voices": list(v)} for g, v in (sc_voices or {}).items()]
    return {"s2s": s2s, "sc": sc}


# --- rendering -----------------------------------------------------------------------------------


def _f(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _ci(est: Any, lo: Any, hi: Any, digits: int = 2) -> str:
    if est is None and lo is None:
        return "–"
    return f"{_f(est, digits)} [{_f(lo, digits)}, {_f(hi, digits)}]"


def card_tables(card: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """The card's tables, cells formatted, keyed like templates/sections.yaml's card tables."""
    rows = []
    for s in card["s2s"]:
        inv, mg, dr = s["invariance"], s["misgender"], s["drift"]
        paper = inv.get("paper") or inv
        summ = s["summarize"] or {}
        mis, ali, diff = mg.get("misaligned", {}), mg.get("aligned", {}), mg.get("difference_pp", {})
        fits = dr["fits"]
        rows.append(
            {
                "system": s["system"],
                "describe": inv["verdict"],
                "OR per content step [95% CI]": _ci(inv["odds_ratio"], inv["ci_low"], inv["ci_high"])
                + {"firth": " (Firth)", "mixed": " (mixed model)"}.get(inv["source"], ""),
                "generalises over": inv.get("generalises_over") or "–",
                "paper's OR [95% CI]": _ci(paper.get("odds_ratio"), paper.get("ci_low"), paper.get("ci_high"))
                + (" (Firth)" if paper.get("source") == "firth" else ""),
                "misgender misaligned [95% CI]": _ci(mis.get("rate"), mis.get("ci_low"), mis.get("ci_high"), 3),
                "misgender aligned [95% CI]": _ci(ali.get("rate"), ali.get("ci_low"), ali.get("ci_high"), 3),
                "misaligned − aligned (pp) [95% CI]": _ci(diff.get("est"), diff.get("ci_low"), diff.get("ci_high"), 1),
                "summarize Δpp": _ci(summ.get("delta_pp"), summ.get("ci_low"), summ.get("ci_high"), 1)
                if summ.get("ci_low") is not None
                else _f(summ.get("delta_pp"), 1),
                "RQ1 drift": dr["verdict"],
                "F0 effect (st): estimates; CIs within": "–"
                if dr["est_min"] is None
                else f"{_f(dr['est_min'], 3)} to {_f(dr['est_max'], 3)}; "
                f"[{_f(dr['ci_low_min'], 3)}, {_f(dr['ci_high_max'], 3)}]",
                "fits toward/away/none/inconcl./unusable": "/".join(
                    str(fits[k]) for k in (FIT_TOWARD, FIT_AWAY, FIT_NONE, FIT_INCONCLUSIVE, FIT_UNUSABLE)
                ),
                "measure": dr["measure"] or "–",
                "RQ1 generalises over": dr.get("generalises_over") or "–",
                "voice continuum (describe)": ((s.get("continuum") or {}).get("describe") or {}).get("sentence", "–"),
            }
        )
    tables = {"card_s2s": pd.DataFrame(rows)}
    sc_voices = {v["voice_gender"]: len(v["voices"]) for v in (card.get("voices") or {}).get("sc", [])}

    def retention_scope(r: dict[str, Any]) -> str:
        # the retention CI resamples prompts (clusters) and keeps the voices as they are
        n_v = sc_voices.get(r["voice_gender"])
        prompts = f"{_f(r['n_prompts'], 0)} prompts (resampled)" if _finite(r.get("n_prompts")) else "prompts"
        return f"{prompts}; these {n_v} voices" if n_v else prompts

    sc_rows = [
        {
            "system": s["system"],
            "gender": r["voice_gender"],
            "measure": r["measure"],
            "retention [95% CI]": _ci(r["retention"], r["ci_low"], r["ci_high"], 3),
            "prompts": _f(r["n_prompts"], 0),
            "generalises over": retention_scope(r),
        }
        for s in card["sc"]
        for r in s["retention"]
    ]
    if sc_rows:
        tables["card_sc"] = pd.DataFrame(sc_rows)
    checks = card["checks"]
    tables["card_checks"] = pd.DataFrame(
        [
            {
                "check": "carrier gate",
                "verdict": checks["carrier_gate"]["verdict"],
                "counts": "; ".join(
                    f"{k.replace('_', ' ')} {_f(v)}" for k, v in checks["carrier_gate"].items() if k != "verdict"
                ),
            },
            {
                "check": "manipulation check",
                "verdict": checks["manipulation_check"]["verdict"],
                "counts": "; ".join(
                    f"{k.replace('_', ' ')} {_f(v)}" for k, v in checks["manipulation_check"].items() if k != "verdict"
                ),
            },
        ]
    )
    pvr = [
        {
            "study": study,
            "quantities": p["n"],
            "recovered": p["recovered"],
            "not recovered": ", ".join(p["not_recovered"]) or "–",
            "outside their own CI": ", ".join(p.get("outside_own_ci", [])) or "–",
        }
        for study, p in card["planted_vs_recovered"].items()
        if p is not None
    ]
    if pvr:
        tables["card_planted"] = pd.DataFrame(pvr)
    exc = card["exclusions"]

    def by_reason(v: dict[str, Any]) -> str:
        counts = v.get("excluded") or {}
        return "; ".join(f"{k.replace('_', ' ')} {n}" for k, n in counts.items()) or "0"

    ex_rows = [
        {
            "system": k,
            "calls": v["calls"],
            "failed calls": v["failed"],
            "non-compliant (excluded)": v["non_compliant"],
            "excluded replies, by reason": by_reason(v),
        }
        for k, v in exc["s2s"].items()
    ]
    ex_rows += [
        {
            "system": k,
            "calls": v["prompts"],
            "failed calls": v["failed"],
            "non-compliant (excluded)": "–",
            "excluded replies, by reason": "–",
        }
        for k, v in exc["sc"].items()
    ]
    ex_rows += [
        {
            "system": "carrier gate stimuli",
            "calls": "–",
            "failed calls": "–",
            "non-compliant (excluded)": _f(exc["carrier_gate_excluded_stimuli"]),
            "excluded replies, by reason": "–",
        },
        {
            "system": "phonation stimuli",
            "calls": "–",
            "failed calls": "–",
            "non-compliant (excluded)": _f(exc["phonation_excluded"]),
            "excluded replies, by reason": by_reason({"excluded": exc.get("phonation_excluded_by_reason")})
            if exc.get("phonation_excluded_by_reason") is not None
            else "–",
        },
    ]
    tables["card_exclusions"] = pd.DataFrame(ex_rows).map(str)
    prov = []
    for k, v in card["provenance"].items():  # a dict value (model revisions, seeds) gets one row per entry
        prov += (
            [{"item": f"{k}: {k2}", "value": _prov(v2)} for k2, v2 in v.items()]
            if isinstance(v, dict) and v
            else [{"item": k, "value": _prov(v)}]
        )
    tables["card_provenance"] = pd.DataFrame(prov, columns=["item", "value"])
    design = card.get("voices") or {"s2s": [], "sc": []}
    voice_rows = [
        {
            "study": "speech-to-speech",
            "language": v["lang"],
            "voice gender": v["voice_gender"],
            "voices": ", ".join(v["voices"]),
            "number": str(len(v["voices"])),
            "certified by the carrier gate": f"{v['certified']} of {len(v['voices'])}",
        }
        for v in design["s2s"]
    ] + [
        {
            "study": "speech continuation",
            "language": "en",
            "voice gender": v["voice_gender"],
            "voices": ", ".join(v["voices"]),
            "number": str(len(v["voices"])),
            "certified by the carrier gate": "– (manipulation check)",
        }
        for v in design["sc"]
    ]
    if voice_rows:
        tables["card_voices"] = pd.DataFrame(voice_rows)
    usage_rows = [
        {
            "system": u["system"],
            "calls": _f(u["calls"], 0),
            "audio in (min)": _f((u["input_audio_s"] or 0) / 60, 2),
            "audio out (min)": _f((u["output_audio_s"] or 0) / 60, 2),
            "tokens in (text / audio)": _tokens_cell(u, "input"),
            "tokens out (text / audio)": _tokens_cell(u, "output"),
            "cost": _cost_cell(u),
            "answered by (model id; fingerprint)": (u.get("model_ids") or "–")
            + (f"; {u['fingerprints']}" if u.get("fingerprints") else ""),
        }
        for u in card.get("usage") or []
    ]
    if usage_rows:
        tables["card_usage"] = pd.DataFrame(usage_rows)
    comp_rows = [
        {
            "system": c["system"],
            "task": c["task"],
            "calls": str(c["calls"]),
            "failed or refused [95% CI]": f"{c['failed']} ({_ci(c['failed_rate'], *c['failed_ci'], 3)})",
            "non-compliant [95% CI]": "–"
            if c["non_compliant"] is None
            else f"{c['non_compliant']} of {c['answered']} ({_ci(c['non_compliant_rate'], *c['non_compliant_ci'], 3)})",
        }
        for c in card.get("compliance") or []
    ]
    if comp_rows:
        tables["card_compliance"] = pd.DataFrame(comp_rows)
    det_rows = [
        {
            "system": d["system"],
            "verdict": d["verdict"],
            "agreement per task (same text and audio / answered probes)": "; ".join(
                f"{t} {v['agree']}/{v['items'] - v.get('failed', 0)}"
                + (f" ({v['failed']} probe(s) failed)" if v.get("failed") else "")
                for t, v in d["tasks"].items()
            ),
            "what it means": d["note"],
        }
        for d in card.get("determinism") or []
    ]
    if det_rows:
        tables["card_determinism"] = pd.DataFrame(det_rows)
    rep_rows = [
        {
            "system": r["system"],
            "task": r["task"],
            "cell": f"{r['metric']}: " + " ".join(v for v in (r["voice_gender"], r["condition"]) if v != "ALL"),
            "this run [95% item CI]": _ci(r["estimate"], r["ci_low"], r["ci_high"], 3),
            "runs": _f(r["replicates"], 0),
            "min / median / max": f"{_f(r['min'], 3)} / {_f(r['median'], 3)} / {_f(r['max'], 3)}",
            "SD": _f(r["sd"], 3),
            "CV": _f(r["cv"], 2),
        }
        for r in card.get("replicates") or []
    ]
    if rep_rows:
        tables["card_replicates"] = pd.DataFrame(rep_rows)
    return tables


def _prov(v: Any) -> str:
    if isinstance(v, dict):
        return "; ".join(f"{k}: {_prov(x)}" for k, x in v.items()) or "–"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(_prov, v)) or "–"
    return _f(v)


def card_context(card: dict[str, Any]) -> dict[str, Any]:
    """What the templates need to show the card: its title, caption, the rules sentence
    (templates/card_rules.txt.j2, filled with the card's thresholds) and its tables in the order and
    with the titles and captions of sections.yaml's `card`."""
    texts = section_texts()["card"]
    tables = card_tables(card)
    env = _template_env()
    return {
        "title": texts["title"],
        "caption": texts["caption"],
        "rules": env.get_template("card_rules.txt.j2").render(rules=card["rules"]).strip(),
        "tables": [{"key": k, **meta, "table": tables[k]} for k, meta in texts["tables"].items() if k in tables],
    }


def render_card_md(card: dict[str, Any]) -> str:
    """The card as markdown (templates/audit_card.md.j2)."""
    return _template_env().get_template("audit_card.md.j2").render(card=card_context(card))


__all__ = [
    "audit_card",
    "voice_design",
    "render_card_md",
    "card_tables",
    "invariance_verdict",
    "odds_estimate",
    "drift_fit_verdict",
    "drift_verdict",
    "fit_usable",
    "recovered",
    "gate_verdict",
    "card_context",
]
