"""Stage 'phonation'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.contract import CONDITIONS, PHONATION_COLUMNS
from voicebias.errors import ConfigError, StageFailed
from voicebias.stimuli.phonation import CONVERTERS, ParametricSettings, _stable_seed, select_prompts
from voicebias.stimuli.phonation.presets import presets_from_params


def run_stage(
    params: dict[str, Any], *, sc_manifest_path: Path, out_dir: Path, metrics_path: Path, root: Path
) -> pd.DataFrame:
    """Stage 'phonation': every selected SC stimulus in every condition of phonation.conditions."""
    from voicebias.io import read_table, write_json, write_table

    ph = params["phonation"]
    conditions = list(ph["conditions"])
    bad = [c for c in conditions if c not in CONDITIONS]
    if bad or "modal" not in conditions:
        raise ConfigError(f"phonation.conditions must include 'modal' and only {list(CONDITIONS)}; got {conditions}")
    presets = presets_from_params(ph)
    backend = ph["backend"]
    if backend not in CONVERTERS:
        raise ConfigError(f"phonation.backend must be {' or '.join(map(repr, CONVERTERS.names()))}, not '{backend}'")
    sc = read_table(sc_manifest_path)
    sc = select_prompts(sc, ph.get("prompts_per_category"), ph.get("max_prompts"))
    out_dir = Path(out_dir)
    audio_dir = out_dir / "audio"
    if audio_dir.exists():
        import shutil

        shutil.rmtree(audio_dir)
    pitch_range = params["acoustics"]["pitch_range"]
    settings = ParametricSettings.from_params(ph.get("parametric"))
    seed = int(params["base"]["seed"])
    rows, jobs = [], []
    for r in sc.itertuples(index=False):
        for c in conditions:
            sid = f"{r.stimulus_id}-{c}"
            base = {
                "stimulus_id": sid,
                "source_stimulus_id": r.stimulus_id,
                "prompt_id": r.prompt_id,
                "prompt_set": r.prompt_set,
                "category": r.category,
                "lang": r.lang,
                "voice_gender": r.voice_gender,
                "voice_id": r.voice_id,
                "phonation": c,
                "text": r.text,
            }
            if c == "modal":
                rows.append(
                    {
                        **base,
                        "backend": "original",
                        "sample_rate": r.sample_rate,
                        "duration_s": r.duration_s,
                        "sha256": r.sha256,
                        "path": r.path,
                        "status": "ok",
                        "error": "",
                        "peak_limited": False,
                    }
                )
                continue
            out = audio_dir / f"{sid}.flac"
            rows.append({**base, "backend": backend, "path": str(out.relative_to(root))})
            floor, ceiling = pitch_range[r.voice_gender]
            jobs.append(
                {
                    "key": sid,
                    "src": str(Path(root) / r.path),
                    "out": str(out),
                    "preset": presets[c],
                    "condition": c,
                    "floor": float(floor),
                    "ceiling": float(ceiling),
                    "settings": settings,
                    "seed": _stable_seed(seed, sid),
                }
            )
    results = CONVERTERS.get(backend)(ph, jobs, out_dir / "vqvc_work", root)
    by_key = {res["key"]: res for res in results}
    for row in rows:
        res = by_key.get(row["stimulus_id"])
        if res is not None:
            row.update({k: v for k, v in res.items() if k != "key"})
    manifest = pd.DataFrame(rows, columns=PHONATION_COLUMNS)
    failed = manifest[manifest["status"] != "ok"]
    write_table(out_dir / "manifest.csv", manifest)
    metrics = {
        "backend": backend,
        "prompts": int(sc["prompt_id"].nunique()),
        "voices": int(sc["voice_id"].nunique()),
        "stimuli": int(len(manifest)),
        "converted": int((manifest["backend"] == backend).sum() - len(failed)),
        "failed": int(len(failed)),
        "peak_limited": int(manifest["peak_limited"].fillna(False).astype(bool).sum()),
    }
    write_json(metrics_path, metrics)
    if len(failed):
        raise StageFailed(
            f"phonation: {len(failed)} conversion(s) failed (listed with their errors in "
            f"{out_dir / 'manifest.csv'}), e.g. {failed['stimulus_id'].iloc[0]}: {failed['error'].iloc[0]}"
        )
    return manifest
