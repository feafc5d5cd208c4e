"""Acoustic scoring of system outputs: the same measures as the inputs, and deltas.

Every output is measured with the analysis settings of its system's fixed output voice gender
(card field `output_voice_gender`), else with gender-neutral settings (MeasureSettings.neutral), so
the measure never assumes the gender it is meant to detect; outputs are placed on the composite
scale of their source language's inputs, and every delta is output minus input. The text-matched
control (`text_control_table`) renders each transcript in one fixed voice: ctrl_<measure> is that
control and net_<measure> = out - ctrl. With repeats there is one row per sample.

The settings, the control and the repeats: docs/rq1.md, "Scoring the outputs" and "The control".
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from voicebias.contract import SAMPLE
from voicebias.instruments.acoustics import MeasureSettings, add_margins, classifier_names, measure_files
from voicebias.instruments.composite import composite_measures, femininity_composite


def control_spec(params: dict[str, Any], card: dict[str, Any]) -> dict[str, Any] | None:
    """The text control of a system: backend, voice per language and speaking rate, or
    None when `acoustic_scoring.text_control.enabled` is false. The card's
    `text_control` ({backend, voices}) replaces the profile's voices."""
    tc = params["acoustic_scoring"]["text_control"]
    if not tc["enabled"]:
        return None
    own = card.get("text_control") or {}
    rate = tc.get("rate_wpm") or params["tts"]["rate_wpm"]
    return {
        "backend": own.get("backend", tc["backend"]),
        "voices": dict(own.get("voices", tc["voices"])),
        "rate_wpm": int(rate),
        "source": "card" if own else "profile",
    }


def render_controls(rows: pd.DataFrame, spec: dict[str, Any], root: Path, cache_dir: Path) -> pd.DataFrame:
    """Render each row's transcript (columns id, transcript, target_lang) in the control
    voice of its language; one row per id: ctrl_path (relative to root), ctrl_sha256,
    ctrl_error ('' when rendered). Renderings are kept under cache_dir keyed by
    (backend, voice, rate, text), so a transcript is synthesised once; the ones not yet
    there are synthesised on every core."""
    from voicebias.audio import sha256_file, write_audio
    from voicebias.cache import content_key
    from voicebias.parallel import ItemFailed, map_processes
    from voicebias.tts import get_backend

    out_dir = Path(cache_dir) / "text_control"
    out_dir.mkdir(parents=True, exist_ok=True)
    plan: list[tuple[Any, str | None, Path | None]] = []
    todo: dict[Path, tuple[str, str]] = {}
    for r in rows.itertuples(index=False):
        voice = spec["voices"].get(r.target_lang)
        text = r.transcript if isinstance(r.transcript, str) else ""
        if voice is None:
            plan.append((r.id, f"no text-control voice for language '{r.target_lang}'", None))
            continue
        if not text.strip():
            plan.append((r.id, "empty transcript", None))
            continue
        dest = out_dir / f"{content_key([spec['backend'], voice, spec['rate_wpm'], text])}.flac"
        if not dest.exists():
            todo.setdefault(dest, (text, voice))
        plan.append((r.id, None, dest))
    failed: dict[Path, str] = {}
    if todo:
        tts = get_backend(spec["backend"], rate_wpm=spec["rate_wpm"])

        def render(job: tuple[Path, str, str]) -> None:
            dest, text, voice = job
            audio, sr = tts.synthesize(text, voice)
            tmp = dest.with_name(f".{dest.stem}.{os.getpid()}.tmp.flac")
            write_audio(tmp, audio, sr)
            tmp.replace(dest)

        jobs = [(d, t, v) for d, (t, v) in todo.items()]
        results = map_processes(render, jobs, size=lambda j: len(j[1]), desc="text controls", failures="return")
        failed = {j[0]: r.error for j, r in zip(jobs, results) if isinstance(r, ItemFailed)}
    recs = []
    for rid, error, dest in plan:
        if dest is not None and dest in failed:
            error = f"text control: {failed[dest]}"
        if error is not None:
            recs.append({"id": rid, "ctrl_path": None, "ctrl_sha256": None, "ctrl_error": error})
            continue
        try:
            rel = str(dest.relative_to(root))
        except ValueError:
            rel = str(dest)
        recs.append({"id": rid, "ctrl_path": rel, "ctrl_sha256": sha256_file(dest), "ctrl_error": ""})
    return pd.DataFrame(recs, columns=["id", "ctrl_path", "ctrl_sha256", "ctrl_error"])


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
    """Measure files (columns id, path) through the measurement cache under cache_dir
    (voicebias.instruments.measure_cache: keyed by each file's sha256, the settings and
    the instrument's code), so identical audio is measured once across systems."""
    return measure_files(
        [(r.id, r.path, settings) for r in paths.itertuples(index=False)],
        sample_rate=sample_rate,
        desc="measuring outputs",
        cache_dir=cache_dir,
    )


def score_outputs(
    responses: pd.DataFrame,
    inputs: pd.DataFrame,
    reference: pd.DataFrame,
    params: dict[str, Any],
    card: dict[str, Any],
    root: Path,
    cache_dir: Path,
) -> pd.DataFrame:
    """One row per response (per sample, with repeats): output measures (out_*), input measures (in_*) and
    deltas (delta_*)."""
    ac = params["acoustics"]
    names = classifier_names(ac)
    measures = composite_measures(names, ac["formant_term"])
    sr = int(params["tts"]["sample_rate"])
    ok = responses[responses["status"] == "ok"].copy()
    repeats = SAMPLE in responses.columns
    ok["id"] = ok["task"] + "/" + ok["stimulus_id"]
    if repeats:
        ok["id"] = ok["id"] + "#" + ok[SAMPLE].astype(int).astype(str)
    keys = [
        "system",
        "task",
        "stimulus_id",
        *([SAMPLE] if repeats else []),
        "passage_id",
        "lang",
        "pole",
        "voice_gender",
        # the input voice, for the RQ1 models' voice random effect (absent from older response tables)
        *(["voice_id"] if "voice_id" in ok.columns else []),
    ]
    ok["path"] = [str(root / p) for p in ok["output_audio"]]
    ok["sha256"] = ok["output_sha256"]
    settings = output_settings(ac, card.get("output_voice_gender"))
    measured = measure_cached(ok[["id", "path", "sha256"]], settings, sr, cache_dir)
    measured = measured.rename(
        columns={"status": "measure_status", "reason": "measure_reason", "error": "measure_error"}
    )
    out = ok.merge(measured, on="id", how="left")
    good = (out["measure_status"] == "ok").to_numpy()
    out["status"] = np.where(good, "ok", "excluded")
    out["rel_path"] = out["output_audio"]
    out = add_margins(out, ac, root, path_col="rel_path")
    out["composite"] = femininity_composite(out, reference, measures)
    cols = [*measures, "composite", "duration_s", "voiced_fraction"]
    table = out[keys].copy()
    table["status"] = np.where(good, "ok", "excluded")
    table["reason"] = np.where(good, "", out["measure_reason"].fillna("measure_error").astype(str))
    table["exclusion"] = np.where(good, "", out["measure_error"].fillna("").astype(str))
    inp = inputs.set_index("stimulus_id")
    for c in cols:
        table[f"out_{c}"] = out[c].to_numpy()
        table[f"in_{c}"] = table["stimulus_id"].map(inp[c]).to_numpy()
        if c in (*measures, "composite"):
            table[f"delta_{c}"] = table[f"out_{c}"] - table[f"in_{c}"]
    spec = control_spec(params, card)
    if spec is not None:
        ctrl = text_control_table(out, spec, settings, sr, reference, measures, ac, root, cache_dir)
        table["control_status"] = ctrl["control_status"].to_numpy()
        table["control_exclusion"] = ctrl["control_exclusion"].to_numpy()
        for c in (*measures, "composite"):
            table[f"ctrl_{c}"] = ctrl[c].to_numpy()
            table[f"net_{c}"] = table[f"out_{c}"] - table[f"ctrl_{c}"]
    # replies that never reached the instrument keep their responses status (failed, or excluded by
    # the reply screen) and reason, the error as the exclusion text
    other = responses[responses["status"] != "ok"]
    failed = other[keys].assign(
        status=other["status"].to_numpy(),
        reason=other["reason"].fillna("call_failed").astype(str).to_numpy()
        if "reason" in other.columns
        else "call_failed",
        exclusion=other["error"].fillna("call failed").astype(str).to_numpy()
        if "error" in other.columns
        else "call failed",
    )
    order = ["task", "stimulus_id", *([SAMPLE] if repeats else [])]
    return pd.concat([table, failed], ignore_index=True).sort_values(order).reset_index(drop=True)


def text_control_table(
    out: pd.DataFrame,
    spec: dict[str, Any],
    settings: MeasureSettings,
    sample_rate: int,
    reference: pd.DataFrame,
    measures: list[str],
    ac: dict[str, Any],
    root: Path,
    cache_dir: Path,
) -> pd.DataFrame:
    """The text-matched control of each measured output (rows of `out`, in order): the
    transcript rendered in the control voice and measured with the output's settings
    and classifiers; columns control_status ('ok', 'excluded' or '' for an output that
    was itself excluded), control_exclusion (why) and the measures and composite."""
    rows = out[["id", "lang", "transcript", "target_lang"]].copy()
    measured_out = (out["measure_status"] == "ok").to_numpy()
    rendered = render_controls(rows[measured_out], spec, root, cache_dir)
    ctrl = rows[["id", "lang"]].merge(rendered, on="id", how="left")
    ready = ctrl["ctrl_path"].notna().to_numpy()
    jobs = pd.DataFrame(
        {
            "id": "control/" + ctrl.loc[ready, "id"],
            "path": [str(Path(root) / p) if not Path(p).is_absolute() else p for p in ctrl.loc[ready, "ctrl_path"]],
            "sha256": ctrl.loc[ready, "ctrl_sha256"],
        }
    )
    m = (
        measure_cached(jobs, settings, sample_rate, cache_dir)
        if len(jobs)
        else pd.DataFrame(columns=["id", "status", "error"])
    )
    m = m.rename(columns={"status": "measure_status", "error": "measure_error"})
    m["id"] = m["id"].str.removeprefix("control/")
    ctrl = ctrl.merge(m, on="id", how="left")
    ok = (ctrl["measure_status"] == "ok").to_numpy()
    ctrl["status"] = np.where(ok, "ok", "excluded")
    ctrl["rel_path"] = ctrl["ctrl_path"]
    ctrl = add_margins(ctrl, ac, root, path_col="rel_path")
    for c in measures:
        if c not in ctrl:
            ctrl[c] = np.nan
    ctrl["composite"] = femininity_composite(ctrl, reference, measures)
    why = np.where(
        ctrl["ctrl_error"].fillna("").astype(str) != "",
        ctrl["ctrl_error"].fillna("").astype(str),
        "text control: " + ctrl["measure_error"].fillna("").astype(str),
    )
    ctrl["control_status"] = np.where(ok, "ok", np.where(measured_out, "excluded", ""))
    ctrl["control_exclusion"] = np.where(ok | ~measured_out, "", why)
    for c in (*measures, "composite"):
        ctrl.loc[~ok, c] = np.nan
    return ctrl
