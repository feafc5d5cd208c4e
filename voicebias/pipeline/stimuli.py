"""Stage 'stimuli'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.stimuli.passages import synthesize_stimuli, validate_manifest, voices_in_use


def run_stage(params: dict[str, Any], *, passages_path: Path, out_dir: Path, root: Path) -> pd.DataFrame:
    """Stage 'stimuli': voice every passage and write the validated manifest."""
    from voicebias.io import read_table, write_json, write_table

    passages = read_table(passages_path)
    manifest = synthesize_stimuli(passages, params["tts"], out_dir / "audio", root)
    validate_manifest(manifest, int(params["tts"]["sample_rate"]))
    write_table(out_dir / "manifest.csv", manifest)
    # engine provenance beside the manifest (its columns are a shared contract)
    write_json(
        out_dir / "backend.json",
        {
            **manifest.attrs.get("backend", {}),
            # the voices that read passages (the first tts.voices_per_gender of each list)
            "voices": {
                lang: {g: voices_in_use(params["tts"], lang, g) for g in ("male", "female")}
                for lang in sorted(set(manifest["lang"]))
            },
            "sample_rate": int(params["tts"]["sample_rate"]),
            "target_rms_dbfs": float(params["tts"]["target_rms_dbfs"]),
        },
    )
    return manifest
