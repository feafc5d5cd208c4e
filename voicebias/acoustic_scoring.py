"""Acoustic scoring of system outputs: the same measures as the inputs, and deltas.

Every output file of a system with one fixed output voice is measured with the
analysis settings of that voice's gender (card field `output_voice_gender`: male or
female). Any other output (the field missing, or a voice that may follow the input,
as voice-preserving systems do) is measured with gender-neutral settings
(MeasureSettings.neutral: a wide pitch range with the octave check and one formant
ceiling), so the measure never assumes the gender it is meant to detect. Outputs
are scored with the same classifiers and placed on the composite scale of their
source language's input stimuli. The delta of every measure is output minus input
(S2S paper, sec. 4: each trial is its own control). Measurements are cached by the
file's sha256 and the analysis settings, so identical outputs of different
systems are measured once.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dataclasses import replace

from voicebias.acoustics import MeasureSettings, add_margins, classifier_names, measure_files
from voicebias.composite import composite_measures, femininity_composite

def output_settings(params: dict[str, Any], gender: str | None) -> MeasureSettings:
    """Settings of a fixed output voice's gender ('male' or 'female'), gender-neutral
    settings otherwise; voice-quality measures off: RQ1 needs F0, formants and margins
    only."""
    if gender in ("male", "female"):
        settings = MeasureSettings.for_gender(params, gender)
    else:
        settings = MeasureSettings.neutral(params)
    return replace(settings, voice_quality=False)


def measure_cached(paths: pd.DataFrame, settings: MeasureSettings, sample_rate: int, cache_dir: Path) -> pd.DataFrame:
    """Measure files (columns id, path, sha256), reusing cached results keyed by sha256 + settings."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    tag = hashlib.sha256(json.dumps([settings.__dict__, sample_rate], sort_keys=True).encode()).hexdigest()[:16]
    rows, todo = [], []
    for r in paths.itertuples(index=False):
        f = cache_dir / f"{r.sha256}-{tag}.json"
        if f.exists():
            rows.append({"id": r.id, **json.loads(f.read_text())})
        else:
            todo.append(r)
    if todo:
        fresh = measure_files([(r.id, r.path, settings) for r in todo], sample_rate=sample_rate, desc="measuring outputs")
        by_id = {r.id: r.sha256 for r in todo}
        for rec in fresh.to_dict("records"):
            key = rec.pop("id")
            (cache_dir / f"{by_id[key]}-{tag}.json").write_text(json.dumps(rec, default=float))
            rows.append({"id": key, **rec})
    return pd.DataFrame(rows)


def score_outputs(responses: pd.DataFrame, inputs: pd.DataFrame, reference: pd.DataFrame, params: dict[str, Any],
                  card: dict[str, Any], root: Path, cache_dir: Path) -> pd.DataFrame:
    """One row per response: output measures (out_*), input measures (in_*) and deltas (delta_*)."""
    ac = params["acoustics"]
    names = classifier_names(ac)
    measures = composite_measures(names)
    sr = int(params["tts"]["sample_rate"])
    ok = responses[responses["status"] == "ok"].copy()
    ok["id"] = ok["task"] + "/" + ok["stimulus_id"]
    ok["path"] = [str(root / p) for p in ok["output_audio"]]
    ok["sha256"] = ok["output_sha256"]
    settings = output_settings(ac, card.get("output_voice_gender"))
    measured = measure_cached(ok[["id", "path", "sha256"]], settings, sr, cache_dir)
    measured = measured.rename(columns={"status": "measure_status", "error": "measure_error"})
    out = ok.merge(measured, on="id", how="left")
    good = (out["measure_status"] == "ok").to_numpy()
    out["status"] = np.where(good, "ok", "excluded")
    out["rel_path"] = out["output_audio"]
    out = add_margins(out, ac, root, path_col="rel_path")
    out["composite"] = femininity_composite(out, reference, measures)
    cols = [*measures, "composite", "duration_s", "voiced_fraction"]
    table = out[["system", "task", "stimulus_id", "passage_id", "lang", "pole", "voice_gender"]].copy()
    table["status"] = np.where(good, "ok", "excluded")
    table["exclusion"] = np.where(good, "", out["measure_error"].fillna("").astype(str))
    inp = inputs.set_index("stimulus_id")
    for c in cols:
        table[f"out_{c}"] = out[c].to_numpy()
        table[f"in_{c}"] = table["stimulus_id"].map(inp[c]).to_numpy()
        if c in (*measures, "composite"):
            table[f"delta_{c}"] = table[f"out_{c}"] - table[f"in_{c}"]
    failed = responses[responses["status"] != "ok"][["system", "task", "stimulus_id", "passage_id", "lang", "pole",
                                                      "voice_gender"]].assign(status="failed", exclusion="call failed")
    return pd.concat([table, failed], ignore_index=True).sort_values(["task", "stimulus_id"]).reset_index(drop=True)


def run_stage(params: dict[str, Any], system: str, responses_root: Path, inputs_path: Path, reference_path: Path,
              out_path: Path, root: Path, cache_dir: Path) -> pd.DataFrame:
    """Stage 'acoustic_scoring': measure one system's outputs and write their deltas."""
    from voicebias.io import read_table, write_table
    from voicebias.systems import load_card

    parts = [read_table(Path(responses_root) / system / t / "responses.csv") for t in params["tasks"]["names"]]
    table = score_outputs(pd.concat(parts, ignore_index=True), read_table(inputs_path), read_table(reference_path),
                          params, load_card(system), root, cache_dir)
    write_table(out_path, table)
    return table
