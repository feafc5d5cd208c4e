"""Stage 'continuum'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.contract import CONTINUUM_COLUMNS
from voicebias.errors import StageFailed


def select_passages(stimuli: pd.DataFrame, languages: list[str], poles: list[str], per_pole: int) -> pd.DataFrame:
    """The renderings of the first `per_pole` passages (by passage id) of each pole in each language."""
    keep = []
    for lang in languages:
        for pole in poles:
            ids = sorted(stimuli.loc[(stimuli["lang"] == lang) & (stimuli["pole"] == pole), "passage_id"].unique())
            keep += ids[:per_pole]
    return stimuli[stimuli["passage_id"].isin(keep)].sort_values(["passage_id", "voice_gender"]).reset_index(drop=True)


def _one_base(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Every step of one base voice's continuum, written; rows of CONTINUUM_COLUMNS."""
    from voicebias.audio import read_audio, sha256_file, write_audio
    from voicebias.stimuli.continuum import make_continuum, manipulation_check

    r, root, out_dir = job["row"], Path(job["root"]), Path(job["out_dir"])
    x, sr = read_audio(root / r["path"])
    base = {
        "source_stimulus_id": r["stimulus_id"],
        "passage_id": r["passage_id"],
        "lang": r["lang"],
        "pole": r["pole"],
        "voice_id": r["voice_id"],
        "voice_gender": r["voice_gender"],
        "sample_rate": sr,
        "duration_s": round(len(x) / sr, 4),
    }
    try:
        audio, steps = make_continuum(x, sr, job["continuum"], job["settings"], corrections=job["corrections"])
    except ValueError as exc:  # the base voice itself cannot be measured: every step is excluded
        return [
            {**base, "stimulus_id": f"{r['stimulus_id']}-s{k}", "step": k, "passed": False, "reason": f"base: {exc}"}
            for k in range(job["continuum"].steps)
        ]
    checked = manipulation_check(steps, job["f0_tolerance_st"], job["formant_tolerance_oct"])
    rows = []
    for y, c in zip(audio, checked.to_dict("records")):
        sid = f"{r['stimulus_id']}-s{int(c['step'])}"
        path = out_dir / "audio" / f"{sid}.flac"
        write_audio(path, y, sr)
        rows.append({**base, **c, "stimulus_id": sid, "path": str(path.relative_to(root)), "sha256": sha256_file(path)})
    return rows


def run_stage(
    params: dict[str, Any], *, stimuli_manifest_path: Path, out_dir: Path, metrics_path: Path, root: Path
) -> pd.DataFrame:
    """Stage 'continuum': each selected passage's male and female renderings moved along the voice
    continuum, every step measured and checked (docs/psychometric.md). Steps the check fails stay in
    the manifest with `passed` false and their reason (counted exclusions); above
    `continuum.max_excluded_fraction` of all steps the stage stops."""
    import shutil

    from voicebias.instruments.acoustics import MeasureSettings
    from voicebias.io import read_table, write_json, write_table
    from voicebias.parallel import map_processes
    from voicebias.stimuli.continuum import Continuum

    p = params["continuum"]
    out_dir = Path(out_dir)
    if (out_dir / "audio").exists():
        shutil.rmtree(out_dir / "audio")
    (out_dir / "audio").mkdir(parents=True, exist_ok=True)
    continuum = Continuum.from_params(p)
    if not p.get("enabled", True):
        manifest = pd.DataFrame(columns=CONTINUUM_COLUMNS)
        write_table(out_dir / "manifest.csv", manifest)
        write_json(metrics_path, {"enabled": False, "passed": True, "steps": 0})
        return manifest
    stimuli = select_passages(read_table(stimuli_manifest_path), p["languages"], p["poles"], p["passages_per_pole"])
    if stimuli.empty:
        raise StageFailed(
            f"continuum: no passage of poles {p['poles']} in languages {p['languages']} in {stimuli_manifest_path}"
        )
    settings = MeasureSettings.neutral(params["acoustics"])
    jobs = [
        {
            "row": r,
            "root": str(root),
            "out_dir": str(out_dir),
            "continuum": continuum,
            "settings": settings,
            "corrections": int(p["corrections"]),
            "f0_tolerance_st": float(p["f0_tolerance_st"]),
            "formant_tolerance_oct": float(p["formant_tolerance_oct"]),
        }
        for r in stimuli.to_dict("records")
    ]
    results = map_processes(_one_base, jobs, size=lambda j: float(j["row"]["duration_s"]), desc="continuum")
    manifest = pd.DataFrame([row for rows in results for row in rows], columns=CONTINUUM_COLUMNS)
    write_table(out_dir / "manifest.csv", manifest)
    excluded = manifest[~manifest["passed"].astype(bool)]
    reasons: dict[str, int] = {}
    for why in excluded["reason"]:
        for part in str(why).split(", "):
            reasons[part] = reasons.get(part, 0) + 1
    measured = manifest[manifest["f0_error_st"].notna()]
    share = len(excluded) / len(manifest)
    metrics = {
        "enabled": True,
        # the continuum_respond stages send the steps only once this is true
        "passed": bool(share <= float(p["max_excluded_fraction"])),
        "variant": p["variant"],
        "continua": int(len(stimuli)),
        "steps": int(len(manifest)),
        "steps_passed": int(len(manifest) - len(excluded)),
        "excluded": int(len(excluded)),
        "excluded_by_reason": dict(sorted(reasons.items())),
        "worst_f0_error_st": round(float(measured["f0_error_st"].abs().max()), 4) if len(measured) else None,
        "worst_formant_error_oct": (
            round(float(measured["formant_error_oct"].abs().max()), 4) if len(measured) else None
        ),
    }
    write_json(metrics_path, metrics)
    if not metrics["passed"]:
        raise StageFailed(
            f"continuum: the manipulation check excluded {len(excluded)} of {len(manifest)} steps "
            f"({share:.1%} > continuum.max_excluded_fraction {float(p['max_excluded_fraction']):.1%}); "
            f"by reason {metrics['excluded_by_reason']}; the steps are listed in {out_dir / 'manifest.csv'}"
        )
    return manifest
