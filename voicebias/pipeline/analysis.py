"""Stage 'analysis'."""

from __future__ import annotations

import pandas as pd

from voicebias.analysis.s2s import (
    compliance,
    describe_by_voice,
    describe_glmm,
    describe_misgender,
    describe_odds_ratios,
    injection_controls,
    planted_vs_recovered,
    summarize_pronouns,
)
from voicebias.blas import single_blas_thread


@single_blas_thread
def run_stage(
    params: dict,
    *,
    scored_paths: list,
    out_dir,
    acoustic_paths: list | None = None,
    planted_truth_paths: dict | None = None,
) -> dict:
    """Stage 'analysis': RQ1 and RQ2 tables, the counted exclusions (exclusions.csv; with planted
    faults, planted_exclusions.csv sets them beside the planted ones), the planted truth and the
    metrics file. `planted_truth_paths` maps a system to the planted truth its respond stage
    recorded (a reference system's; a path that does not exist is a system under audit).

    With repeats (scored tables with a sample column, run.samples_per_item > 1) every
    table is estimated on items (voicebias.analysis.repeats) and the between-sample
    variance goes to out_dir/repeats_variance.csv; without repeats that table has its
    columns and no rows (dvc.yaml declares it, so it is always written).
    """
    from pathlib import Path

    from voicebias.io import read_json, read_table, write_json, write_table

    out_dir = Path(out_dir)
    scored = pd.concat([read_table(Path(p)) for p in scored_paths], ignore_index=True)
    conf = float(params["analyze"]["confidence"])
    odds = describe_odds_ratios(scored, conf)
    glmm = describe_glmm(scored, conf)
    rates, fisher = describe_misgender(scored, conf)
    by_voice = describe_by_voice(scored, conf)
    pron = summarize_pronouns(scored)
    pron_lang = summarize_pronouns(scored, by_language=True)
    controls = injection_controls(scored)
    comp = compliance(scored)
    planted = {
        s: read_json(Path(p))
        for s, p in (planted_truth_paths or {}).items()
        if s in set(scored["system"]) and Path(p).exists()
    }
    from voicebias.analysis.rq1 import rq1_tables as build_rq1_tables

    rq1_tables: dict[str, pd.DataFrame] = {}
    if acoustic_paths:
        acoustic = pd.concat([read_table(Path(p)) for p in acoustic_paths], ignore_index=True)
        rq1_tables = build_rq1_tables(acoustic, conf)
    from voicebias.analysis.exclusions import exclusion_counts, exclusions_vs_planted, planted_exclusions

    excluded = exclusion_counts(scored, acoustic if acoustic_paths else None)
    planted_excluded = exclusions_vs_planted(excluded, planted_exclusions(scored, planted))
    f0 = "net_f0_median_st" if acoustic_paths and "net_f0_median_st" in acoustic else "delta_f0_median_st"
    pvr = planted_vs_recovered(
        odds,
        rates,
        planted,
        rq1_tables.get("rq1_pooled"),
        rq1_tables.get("rq1_mixed_models"),
        f0_measure=f0,
        glmm=glmm,
        by_voice=by_voice,
        confidence=conf,
    )
    for name, df in [
        *rq1_tables.items(),
        ("describe_odds_ratios", odds),
        ("describe_glmm", glmm),
        ("describe_misgender", rates),
        ("describe_by_voice", by_voice),
        ("describe_fisher", fisher),
        ("summarize_pronouns", pron),
        ("summarize_pronouns_by_lang", pron_lang),
        ("injection_controls", controls),
        ("compliance", comp),
        ("exclusions", excluded),
        ("planted_exclusions", planted_excluded),
        ("planted_vs_recovered", pvr),
    ]:
        write_table(out_dir / f"{name}.csv", df)
    write_json(out_dir / "planted_truth.json", planted)
    from voicebias.analysis.disaggregated import s2s_items
    from voicebias.analysis.repeats import VARIANCE_COLUMNS, between_sample_variance, has_repeats

    variance = (
        between_sample_variance(s2s_items(scored, acoustic if acoustic_paths else None))
        if has_repeats(scored)
        else pd.DataFrame(columns=VARIANCE_COLUMNS)
    )
    write_table(out_dir / "repeats_variance.csv", variance)
    metrics: dict = {}
    for r in odds.itertuples():
        m = metrics.setdefault(r.system, {}).setdefault("describe", {}).setdefault(r.lang, {})
        m.update(
            odds_ratio=r.odds_ratio,
            ci_low=r.ci_low,
            ci_high=r.ci_high,
            p_value=r.p_value,
            n=r.n,
            fit_status=r.fit_status,
        )
    for r in rates[rates["lang"] == "ALL"].itertuples():
        metrics[r.system]["describe"]["ALL"][f"misgender_{r.cell_type}"] = r.rate
    for r in pron.itertuples():
        metrics.setdefault(r.system, {})["summarize"] = {"delta_pp": r.delta_pp, "injection_rate": r.injection_rate}
    for r in rq1_tables.get("rq1_pooled", pd.DataFrame()).itertuples():
        if r.system == "ALL":
            continue
        key = f"rq1_{r.task_group}_{r.measure}".replace("-", "_")
        metrics.setdefault(r.system, {})[key] = {
            "pooled_contrast": r.pooled_contrast,
            "ci_low": r.ci_low,
            "ci_high": r.ci_high,
            "p_value": r.p_value,
        }
    write_json(out_dir / "metrics.json", metrics)
    return metrics
