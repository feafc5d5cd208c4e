"""Stage 'psychometric'."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from voicebias.analysis.planted import SIMULTANEOUS_COLUMNS

#: the columns of reports/psychometric/curves.csv: each fitted function with its pointwise band
CURVE_COLUMNS = ["system", "task", "lang", "pole", "x_st", "p", "p_low", "p_high"]
#: the columns of reports/psychometric/planted_vs_recovered.csv
PLANTED_COLUMNS = [
    "system",
    "task",
    "quantity",
    "pole",
    "planted",
    "estimate",
    "ci_low",
    "ci_high",
    "planted_in_ci",
    *SIMULTANEOUS_COLUMNS,
    "recovered",
    "status",
    "reason",
]


#: the columns of reports/psychometric/answers.csv
ANSWER_COLUMNS = [
    "system",
    "task",
    "lang",
    "stimulus_id",
    "step",
    "x_st",
    "pole",
    "passage_id",
    "base_voice",
    "status",
    "y",
]


def continuum_answers(manifest: pd.DataFrame, responses: pd.DataFrame) -> pd.DataFrame:
    """One row per continuum answer: system, task, lang, stimulus_id, step, x_st, pole, passage_id,
    base_voice, status and y (1 female / "she", 0 male / "he"; NaN for an answer that names
    neither or both, or a failed call)."""
    from voicebias.scoring.text import score_responses

    if responses.empty:
        return pd.DataFrame(columns=ANSWER_COLUMNS)
    scored = score_responses(responses)
    y = np.full(len(scored), np.nan)
    describe = (scored["task"] == "describe").to_numpy()
    judged = scored["judged_gender"].to_numpy(object)
    y[describe & (judged == "female")] = 1.0
    y[describe & (judged == "male")] = 0.0
    choice = scored["pronoun_choice"].to_numpy(object)
    other = ~describe
    y[other & (choice == "female")] = 1.0
    y[other & (choice == "male")] = 0.0
    steps = manifest[["stimulus_id", "step", "x_st"]].assign(base_voice=manifest["voice_id"])
    out = scored[["system", "task", "lang", "stimulus_id", "pole", "passage_id", "status"]].assign(y=y)
    out = out.merge(steps, on="stimulus_id", how="left", validate="many_to_one")
    return out[ANSWER_COLUMNS]


def planted_vs_recovered(
    table: pd.DataFrame,
    planted: dict[str, dict[str, Any]],
    refit: Callable[[float], pd.DataFrame] | None = None,
    confidence: float = 0.95,
) -> pd.DataFrame:
    """For each reference system with planted psychometric truth (`planted`: system -> the truth of
    voicebias.systems.reference.planted_psychometric), the pooled estimates beside the planted
    values and whether each interval holds its planted value (`planted_in_ci`). A system planted
    flat in the voice is compared on its slope only, planted 0 (no boundary is then estimated).

    `refit(coverage)` gives the pooled table of the same fits with their intervals at another
    coverage. With it every value is also set beside its simultaneous interval
    (voicebias.analysis.planted.with_simultaneous: the same Wald and Fieller intervals at the
    Bonferroni coverage over each system's values compared, one refit), and `recovered` says whether the
    planted value lies in it; without it, `recovered` is `planted_in_ci`."""
    from functools import lru_cache

    from voicebias.analysis.planted import with_simultaneous

    refit_at = lru_cache(maxsize=None)(refit) if refit is not None else None

    def recipe(key: tuple) -> Callable[[float], tuple[float, float]] | None:
        if refit_at is None:
            return None

        def at(coverage: float) -> tuple[float, float]:
            t = refit_at(coverage)
            r = t[(t["system"] == key[0]) & (t["task"] == key[1]) & (t["lang"] == "ALL")]
            r = r[(r["quantity"] == key[2]) & (r["pole"] == key[3])].iloc[0]
            return float(r["ci_low"]), float(r["ci_high"])

        return at

    rows = []
    pooled = table[table["lang"] == "ALL"]
    for system, truth in sorted(planted.items()):
        for task, g in pooled[pooled["system"] == system].groupby("task", sort=True):
            est = g.set_index(["quantity", "pole"])
            if not truth["follows_voice"]:
                wanted = [(("slope", ""), 0.0)]
            else:
                wanted = [(("slope", ""), truth["slope_per_st"])]
                wanted += [
                    (("pse", pole), value) for pole, value in truth["pse_st"].items() if ("pse", pole) in est.index
                ]
                shift_key = next((k for k in est.index if k[0] == "shift"), None)
                if shift_key is not None:
                    wanted.append((shift_key, truth["shift_st"]))
            for (q, pole), value in wanted:
                r = est.loc[(q, pole)]
                rows.append(
                    {
                        "system": system,
                        "task": task,
                        "quantity": q,
                        "pole": pole,
                        "planted": float(value),
                        **{k: r[k] for k in ("estimate", "ci_low", "ci_high", "status", "reason")},
                        "planted_in_ci": bool(np.isfinite(r["ci_low"]) and r["ci_low"] <= value <= r["ci_high"]),
                        "interval": recipe((system, task, q, pole)),
                    }
                )
    out = with_simultaneous(rows, confidence)
    if len(out):
        out["recovered"] = out["planted_in_simultaneous_ci"] if refit is not None else out["planted_in_ci"]
        out["recovered"] = out["recovered"].fillna(False).astype(bool)
    return out.reindex(columns=PLANTED_COLUMNS)


def run_stage(
    params: dict[str, Any],
    *,
    manifest_path: Path,
    responses_dir_for: Callable[[str, str], Path],
    out_dir: Path,
    metrics_path: Path,
) -> pd.DataFrame:
    """Stage 'psychometric': every system's continuum answers, scored, fitted per system x task,
    pooled and per language (voicebias.analysis.psychometric), with the reference systems' planted
    values beside their estimates. Writes psychometric.csv, answers.csv, curves.csv and
    planted_vs_recovered.csv to `out_dir`, and the counts per system to `metrics_path`."""
    from voicebias.analysis.psychometric import psychometric_table
    from voicebias.cards import load_card
    from voicebias.io import read_table, write_json, write_table
    from voicebias.stimuli.continuum import Continuum
    from voicebias.systems.reference import planted_psychometric

    p = params["continuum"]
    continuum = Continuum.from_params(p)
    manifest = read_table(manifest_path)
    systems = list(params["run"]["systems"])
    parts = []
    for system in systems:
        for task in p["tasks"]:
            path = Path(responses_dir_for(system, task)) / "responses.csv"
            if path.exists():
                parts.append(read_table(path))
    responses = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    answers = continuum_answers(manifest, responses)
    confidence = float(params["analyze"]["confidence"])
    curves: list[dict] = []
    table = psychometric_table(answers, continuum, poles=list(p["poles"]), confidence=confidence, curves=curves)
    planted = {
        s: planted_psychometric(params["systems"][s], list(p["poles"]))
        for s in systems
        if load_card(s)["adapter"] == "reference"
    }
    mine = answers[answers["system"].isin(list(planted))]

    def refit(coverage: float) -> pd.DataFrame:
        return psychometric_table(mine, continuum, poles=list(p["poles"]), confidence=coverage, pooled_only=True)

    compared = planted_vs_recovered(table, planted, refit, confidence)
    out_dir = Path(out_dir)
    write_table(out_dir / "answers.csv", answers)
    write_table(out_dir / "psychometric.csv", table)
    write_table(out_dir / "planted_vs_recovered.csv", compared)
    write_table(out_dir / "curves.csv", pd.DataFrame(curves, columns=CURVE_COLUMNS))
    # per system, so that a change to one system moves only its own keys (`dvc metrics diff`)
    metrics: dict[str, Any] = {}
    for system in systems:
        a = answers[answers["system"] == system]
        ok = a["status"] == "ok"
        mine = compared[compared["system"] == system]
        metrics[system] = {
            "answers": int(len(a)),
            "failed_calls": int((~ok).sum()),
            "unscorable": int((ok & a["y"].isna()).sum()),
            "fits": int(table.loc[table["system"] == system, ["task", "lang"]].drop_duplicates().shape[0]),
            **(
                {"planted_recovered": int(mine["recovered"].sum()), "planted_values": int(len(mine))}
                if len(mine)
                else {}
            ),
        }
    write_json(metrics_path, metrics)
    return table
