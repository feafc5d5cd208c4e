"""Stage 'report': the audit card (reports/report/audit_card.{md,json}) and the report it opens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from voicebias import config
from voicebias.io import read_json, write_json


def _metrics(path: Path | None) -> dict[str, Any] | None:
    return read_json(path) if path is not None and Path(path).is_file() else None


def _table(path: Path):
    from voicebias.io import read_table

    return read_table(path) if Path(path).is_file() else None


def _sc_voices(params: dict[str, Any]) -> dict[str, list[str]] | None:
    """The SC prompt voices of params (sc_stimuli.voices), or None when the run has no SC study."""
    if not (params.get("run") or {}).get("sc_systems"):
        return None
    voices = (params.get("sc_stimuli") or {}).get("voices")
    return {g: list(v) for g, v in voices.items()} if voices else None


def determinism_records(params: dict[str, Any], report_for: Any = config.respond_report) -> dict[str, dict[str, Any]]:
    """{system: {task: the determinism probe's counts}} from the respond stages' records
    (reports/respond/<system>/<task>.json), for the systems and tasks that were probed."""
    out: dict[str, dict[str, Any]] = {}
    for system in (params.get("run") or {}).get("systems") or []:
        for task in (params.get("tasks") or {}).get("names") or []:
            rec = _metrics(report_for(system, task))
            if rec and isinstance(rec.get("determinism"), dict):
                out.setdefault(system, {})[task] = rec["determinism"]
    return out


def replicate_spread(params: dict[str, Any], replicates_for: Any, disaggregated: Path | None) -> Any:
    """The whole-run replicates' spread of every system of run.systems (`replicates_for(system)`/spread.csv,
    absent ones skipped) with run 0's item intervals from the disaggregated table; None without any."""
    import pandas as pd

    from voicebias.report.card import with_item_intervals

    tables = [_table(Path(replicates_for(s)) / "spread.csv") for s in (params.get("run") or {}).get("systems") or []]
    tables = [t for t in tables if t is not None and len(t)]
    if not tables:
        return None
    return with_item_intervals(
        pd.concat(tables, ignore_index=True), _table(Path(disaggregated)) if disaggregated is not None else None
    )


def run_stage(
    params: dict[str, Any],
    *,
    analysis_dir: Path,
    gate_dir: Path,
    bank_metrics: Path,
    out_dir: Path,
    sc_dir: Path | None = None,
    phonation_dir: Path | None = None,
    root: Path = config.ROOT,
    manifest: Path = config.STIMULI_MANIFEST,
    cards_dir: Path = config.CARDS_DIR,
    disaggregated: Path | None = None,
    psychometric_dir: Path | None = None,
    usage_table: Path | None = None,
    replicates_for: Any = None,
) -> dict:
    """Build the audit card from the analysis tables and the check metrics (carrier_gate/metrics.json,
    phonation/check_metrics.json), write it as audit_card.json and audit_card.md, then the report with
    the card first."""
    # here, not at the top: the tracking stage imports this module for determinism_records only
    from voicebias.report.build import build_report
    from voicebias.report.card import audit_card, card_context, render_card_md, voice_design
    from voicebias.report.provenance import collect_provenance

    provenance = collect_provenance(root, params, manifest, cards_dir)
    card = audit_card(
        analysis_dir,
        sc_dir,
        _metrics(Path(gate_dir) / "metrics.json"),
        _metrics(Path(phonation_dir) / "check_metrics.json" if phonation_dir is not None else None),
        provenance,
        voices=voice_design(_table(Path(gate_dir) / "voices.csv"), _sc_voices(params)),
        psychometric=_table(Path(psychometric_dir) / "psychometric.csv") if psychometric_dir is not None else None,
        usage=_table(Path(usage_table)) if usage_table is not None else None,
        determinism=determinism_records(params),
        samples_per_item=int(params["run"].get("samples_per_item", 1)),
        replicates=replicate_spread(params, replicates_for, disaggregated) if replicates_for is not None else None,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "audit_card.json", card)
    (out_dir / "audit_card.md").write_text(render_card_md(card), encoding="utf-8")
    paths = build_report(
        params,
        analysis_dir,
        gate_dir,
        bank_metrics,
        out_dir,
        sc_dir,
        phonation_dir,
        card=card_context(card),
        disaggregated=disaggregated,
        psychometric_dir=psychometric_dir,
    )
    return {**paths, "card_md": out_dir / "audit_card.md", "card_json": out_dir / "audit_card.json"}
