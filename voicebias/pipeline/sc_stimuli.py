"""Stage 'sc_stimuli'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.contract import GENDERS, PROMPT_SETS
from voicebias.errors import ConfigError
from voicebias.stimuli.prompts import (
    import_ss_clips,
    load_nop_set,
    load_ss_set,
    sc_voices,
    ss_prompts,
    synthesize_prompts,
    validate_nop_set,
    validate_sc_manifest,
)
from voicebias.stimuli.selection import selected_prompt_ids


def run_stage(params: dict[str, Any], *, out_dir: Path, metrics_path: Path, root: Path) -> pd.DataFrame:
    """Stage 'sc_stimuli': validate the NOP_set, select the SS_set (when enabled), voice
    the prompts with the SC voices; write prompts.csv, manifest.csv and backend.json
    under out_dir, and the stage metrics."""
    from voicebias.io import write_json, write_table
    from voicebias.params import SCStimuli, validate_section

    sc = validate_section(SCStimuli, params["sc_stimuli"], "sc_stimuli")
    nop = load_nop_set(Path(root) / sc["nop_set"])
    validate_nop_set(nop, int(sc["nop_categories"]), int(sc["nop_per_category"]))
    prompts = [nop]
    ss_cfg = sc.get("ss_set") or {}
    clips = None
    if ss_cfg.get("enabled"):
        ss_root = Path(ss_cfg["root"])
        clips = load_ss_set(
            ss_root if ss_root.is_absolute() else Path(root) / ss_root,
            ss_cfg["subset"],
            float(ss_cfg["min_duration_s"]),
        )
        if clips.empty:
            raise ConfigError(f"no Spoken StereoSet clip is longer than {ss_cfg.get('min_duration_s', 3.0)} s")
        prompts.append(ss_prompts(clips))
    table = pd.concat(prompts, ignore_index=True)
    audio_dir = Path(out_dir) / "audio"
    voicing = ss_cfg["voicing"]
    if voicing not in ("sc_voices", "original"):
        raise ConfigError(f"sc_stimuli.ss_set.voicing must be 'sc_voices' or 'original', not '{voicing}'")
    # only the prompts the study converts (phonation.prompts_per_category, max_prompts) are voiced;
    # prompts.csv lists every prompt
    ph = params["phonation"]
    chosen = set(selected_prompt_ids(table, ph.get("prompts_per_category"), ph.get("max_prompts")))
    to_voice = table[table["prompt_id"].isin(chosen)]
    if voicing != "sc_voices":
        to_voice = to_voice[to_voice["prompt_set"] == "nop"]
    manifest = synthesize_prompts(to_voice, sc, audio_dir, root)
    backend = manifest.attrs.get("backend", {})
    if clips is not None and voicing == "original":
        ss = ss_prompts(clips)
        texts = set(ss.loc[ss["prompt_id"].isin(chosen), "text"])
        kept = clips[clips["text"].isin(texts)]
        manifest = pd.concat([manifest, import_ss_clips(kept, sc, audio_dir, root)], ignore_index=True)
    n_voices = len(sc_voices(sc))
    voiced = manifest[manifest["backend"] != "spoken_stereoset"]
    validate_sc_manifest(voiced, int(sc["sample_rate"]), n_voices)
    if len(voiced) < len(manifest):  # otherwise the same table, whose suite (less two checks) just passed
        validate_sc_manifest(manifest, int(sc["sample_rate"]))
    write_table(Path(out_dir) / "prompts.csv", table)
    write_table(Path(out_dir) / "manifest.csv", manifest)
    write_json(
        Path(out_dir) / "backend.json",
        {
            **backend,
            "voices": sc["voices"],
            "sample_rate": int(sc["sample_rate"]),
            "target_rms_dbfs": float(sc["target_rms_dbfs"]),
        },
    )
    metrics: dict[str, Any] = {
        "prompts": {s: int((table["prompt_set"] == s).sum()) for s in PROMPT_SETS},
        "stimuli": int(len(manifest)),
        "voices": {g: int(sum(1 for v in sc_voices(sc) if v[0] == g)) for g in GENDERS},
        "mean_duration_s": {
            s: round(float(manifest.loc[manifest["prompt_set"] == s, "duration_s"].mean()), 3)
            for s in PROMPT_SETS
            if (manifest["prompt_set"] == s).any()
        },
        "nop_categories": int(nop["category"].nunique()),
    }
    if clips is not None:
        metrics["ss_clips_selected"] = int(len(clips))
    write_json(Path(metrics_path), metrics)
    return manifest
