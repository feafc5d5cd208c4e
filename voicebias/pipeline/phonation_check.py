"""Stage 'phonation_check'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.gates.phonation_check import (
    classifier_flips,
    measure_stimuli,
    paired_changes,
    speaker_similarities,
    stimulus_exclusions,
    summarise,
    validate_check,
    validate_exclusions,
    validate_flips,
)
from voicebias.stimuli.phonation.presets import presets_from_params


def run_stage(
    params: dict[str, Any],
    *,
    manifest_path: Path,
    out_dir: Path,
    metrics_path: Path,
    root: Path,
    measure_cache: Path | None = None,
    embedding_cache: Path | None = None,
) -> pd.DataFrame:
    """Stage 'phonation_check': measures, similarities, summary table, GE gate, metrics, and the
    per-stimulus exclusions (excluded_stimuli.csv): the stage fails when a condition moves a measure
    the wrong way or more than phonation.max_excluded_fraction of the stimuli are excluded."""
    from voicebias.instruments.embeddings import embedder_from_params
    from voicebias.io import read_table, write_json, write_table

    presets = presets_from_params(params["phonation"])
    manifest = read_table(manifest_path)
    measured = measure_stimuli(manifest, params["acoustics"], root, cache_dir=measure_cache)
    own, between = speaker_similarities(
        manifest, embedder_from_params(params["acoustics"], root), root, cache_dir=embedding_cache
    )
    margins, flips = classifier_flips(measured, params["acoustics"], root)
    changes = paired_changes(measured, presets)
    summary = summarise(changes, own, between, manifest)
    out_dir = Path(out_dir)
    write_table(out_dir / "measures.csv", measured.merge(own, on="stimulus_id", how="left"))
    write_table(out_dir / "between_voice_similarity.csv", between)
    write_table(out_dir / "manipulation_check.csv", summary)
    write_table(out_dir / "classifier_flips.csv", flips)
    excluded = stimulus_exclusions(measured, margins)
    write_table(out_dir / "excluded_stimuli.csv", excluded)
    max_fraction = float(params["phonation"]["max_excluded_fraction"])
    wrong = summary[~summary["ok"]]
    n = int(len(manifest))
    metrics: dict[str, Any] = {
        "stimuli": n,
        "excluded": int(len(excluded)),
        "excluded_by_reason": {str(k): int(v) for k, v in excluded["reason"].value_counts().sort_index().items()},
        "excluded_fraction": round(len(excluded) / n, 6) if n else 0.0,
        "max_excluded_fraction": max_fraction,
        "checked_cells": int((summary["expected_sign"] != 0).sum()),
        "wrong_direction": int(len(wrong)),
        "classifier_flips": int(flips["flips"].sum()),
        "passed": bool(wrong.empty) and len(excluded) <= max_fraction * n,
    }
    whole = summary[summary["contrast"].isin(["converted_vs_modal", "second_half_vs_modal_second_half"])]
    for (ph, measure, contrast), s in whole.groupby(["phonation", "measure", "contrast"]):
        metrics.setdefault(ph, {})[f"{measure}__{contrast}"] = round(float(s["mean_change"].mean()), 4)
    sims = summary[summary["measure"] == "speaker_similarity"]
    for (ph, contrast), s in sims.groupby(["phonation", "contrast"]):
        metrics.setdefault(ph, {})[f"speaker_similarity__{contrast}"] = round(float(s["mean_change"].mean()), 4)
    metrics["between_voice_similarity"] = {
        g: round(float(s["between_similarity"].mean()), 4) for g, s in between.groupby("voice_gender")
    }
    write_json(metrics_path, metrics)
    validate_check(summary)
    validate_exclusions(excluded, n, max_fraction)
    validate_flips(margins[~margins["stimulus_id"].isin(excluded["stimulus_id"])])  # none left in
    return summary
