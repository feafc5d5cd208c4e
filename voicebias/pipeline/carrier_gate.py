"""Stage 'carrier_gate'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from voicebias.gates.carrier_gate import PASSING, carrier_gate, require_gate, voice_certificates


def run_stage(params: dict[str, Any], *, measures_path: Path, out_dir: Path) -> pd.DataFrame:
    """Stage 'carrier_gate': write the gate table and the per-voice certificates, and stop
    (exit non-zero) when either fails."""
    from voicebias.io import read_table, write_json, write_table

    inputs = read_table(measures_path)
    c = params["acoustics"]["classifier"]
    names = [c] if isinstance(c, str) else list(c)
    secondary = [m for m in params["carrier_gate"]["measures"] if m != "composite"]
    table, flips = carrier_gate(
        inputs,
        names,
        float(params["carrier_gate"]["alpha"]),
        "composite",
        secondary,
        strict=bool(params["carrier_gate"]["strict"]),
    )
    voices = voice_certificates(inputs, names, float(params["carrier_gate"]["alpha"]), "composite")
    write_table(out_dir / "gate.csv", table)
    write_table(out_dir / "flips.csv", flips)
    write_table(out_dir / "voices.csv", voices)
    excluded = inputs[inputs["status"] != "ok"]
    write_json(
        out_dir / "metrics.json",
        {
            "passed": bool(table["verdict"].isin(PASSING).all() and voices["verdict"].isin(PASSING).all()),
            "voices": int(len(voices)),
            "voices_certified": int(voices["verdict"].isin(PASSING).sum()),
            "flips": int(len(flips)),
            "excluded_stimuli": int(len(excluded)),
            "composite_p": {
                (r.lang if r.phonation == "all" else f"{r.lang}/{r.phonation}"): r.p_content
                for r in table[table["measure"] == "composite"].itertuples()
            },
        },
    )
    require_gate(table, flips, voices)
    return table
