"""Benchmark: does the formant index follow F0? Synthetic vowels whose formants stay put while F0 moves.

The grid: Hillenbrand et al.'s (1995) 12 vowels at the published mean F1-F4 of each group (men,
women, children: three tract lengths; means over every talker of the group in the published
measurement table, tests/fixtures/real/hillenbrand1995/orig_vowdata.dat, F5 = 1.2 F4) x F0 from 90
to 300 Hz in steps of 30 Hz, each a 0.5 s source-filter vowel at 16 kHz (tests/fakes/stimuli.py:
Rosenberg pulses through five resonators), measured with the gender-neutral settings of the
embedded profile (DAP formants below 5500 Hz, pitch 60-500 Hz with the octave check).

Per vowel x group, over the F0s below 0.8 F1 (where F1 can be resolved from the harmonics): the
range of the F1-F3 formant index and of the vocal-tract index (F3-F4), each in octaves and in
its own reference SD (the measure's SD over the modal SC stimuli, reports/phonation/measures.csv,
as in benchmarks/formant_accuracy.py), and the worst F2, F3 and F4 errors. Target: at most 0.25 SD
in every cell. Prints markdown (docs/formants.md, "F0 invariance on Hillenbrand's vowels").

    .venv/bin/python benchmarks/formant_f0_invariance.py
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakes.stimuli import synthetic_vowel  # noqa: E402
from voicebias.instruments.acoustics import MeasureSettings, measure_signal  # noqa: E402
from voicebias.instruments.formants import MALE_FORMANT_NORMS  # noqa: E402
from voicebias.params import load_params  # noqa: E402

SR = 16000
F0S = tuple(float(f) for f in range(90, 301, 30))
GROUPS = {"m": "men", "w": "women", "b": "children", "g": "children"}
TARGET_SD = 0.25
TABLE = ROOT / "tests" / "fixtures" / "real" / "hillenbrand1995" / "orig_vowdata.dat"


def group_means() -> pd.DataFrame:
    """Mean F1-F4 (Hz) per group x vowel over every talker of the published table (zeros,
    'not measurable', left out)."""
    rows = []
    for line in TABLE.read_text(encoding="latin-1").splitlines():
        parts = line.split()
        if len(parts) == 16 and parts[0][:1] in GROUPS and parts[0][1:3].isdigit():
            rows.append(
                {
                    "group": GROUPS[parts[0][0]],
                    "vowel": parts[0][3:5],
                    **{f"f{i}": float(parts[2 + i]) for i in (1, 2, 3, 4)},
                }
            )
    table = pd.DataFrame(rows).replace(0.0, np.nan)
    return table.groupby(["group", "vowel"]).mean().reset_index()


def reference_sd(measure: str) -> float:
    import io
    import subprocess

    path = ROOT / "reports" / "phonation" / "measures.csv"
    if path.is_file():
        measures = pd.read_csv(path)
    else:  # while the pipeline rewrites it: the committed version
        text = subprocess.run(
            ["git", "show", "HEAD:reports/phonation/measures.csv"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        measures = pd.read_csv(io.StringIO(text))
    return float(measures.loc[measures["phonation"] == "modal", measure].std(ddof=1))


def run_grid() -> pd.DataFrame:
    settings = replace(
        MeasureSettings.neutral(load_params(ROOT / "profiles" / "embedded.yaml")["acoustics"]), voice_quality=False
    )
    rows = []
    for r in group_means().itertuples():
        formants = (r.f1, r.f2, r.f3, r.f4, 1.2 * r.f4)
        true_index = float(np.mean(np.log2(np.array([r.f1, r.f2, r.f3]) / np.array(MALE_FORMANT_NORMS))))
        for f0 in F0S:
            m = measure_signal(synthetic_vowel(f0, formants), SR, settings)
            rows.append(
                {
                    "group": r.group,
                    "vowel": r.vowel,
                    "f0_hz": f0,
                    "f1_true": r.f1,
                    **{f"f{i}_err_pct": 100 * (m[f"f{i}_hz"] / getattr(r, f"f{i}") - 1) for i in (1, 2, 3)},
                    "f4_err_pct": 100 * (m["f4_hz"] / r.f4 - 1),
                    "index": m["formant_index"],
                    "index_true": true_index,
                    "vtl": m["vtl_index"],
                }
            )
    grid = pd.DataFrame(rows)
    grid["resolvable"] = grid["f0_hz"] < 0.8 * grid["f1_true"]
    return grid


def cells(grid: pd.DataFrame, sd: float, vtl_sd: float) -> pd.DataFrame:
    """Per group x vowel over its resolvable F0s: each index's range (octaves, SD), worst F2-F4 errors."""
    g = grid[grid["resolvable"]]

    def worst(s: pd.Series) -> float:
        return s.iloc[np.argmax(np.abs(s.to_numpy()))]

    out = g.groupby(["group", "vowel"]).agg(
        f0s=("f0_hz", "size"),
        index_range_oct=("index", lambda s: s.max() - s.min()),
        vtl_range_oct=("vtl", lambda s: s.max() - s.min()),
        worst_f2_err_pct=("f2_err_pct", worst),
        worst_f3_err_pct=("f3_err_pct", worst),
        worst_f4_err_pct=("f4_err_pct", worst),
    )
    out["index_range_sd"] = out["index_range_oct"] / sd
    out["vtl_range_sd"] = out["vtl_range_oct"] / vtl_sd
    return out.reset_index()


def main() -> None:
    sd, vtl_sd = reference_sd("formant_index"), reference_sd("vtl_index")
    grid = run_grid()
    table = cells(grid, sd, vtl_sd)
    resolvable = grid[grid["resolvable"]]
    for name, col, ref in (("formant index (F1-F3)", "index", sd), ("vocal-tract index (F3-F4)", "vtl", vtl_sd)):
        miss = table[table[f"{col}_range_sd"] > TARGET_SD]
        worst = table.loc[table[f"{col}_range_sd"].idxmax()]
        missed = ", ".join(f"{r.group} {r.vowel} {getattr(r, f'{col}_range_sd'):.2f}" for r in miss.itertuples())
        print(
            f"{name}: reference SD {ref:.4f} octaves (target {TARGET_SD} SD = {TARGET_SD * ref:.4f}); "
            f"{len(table) - len(miss)} of {len(table)} cells within; worst {worst[f'{col}_range_sd']:.2f} SD "
            f"({worst['group']} {worst['vowel']}); missed: " + (missed or "none") + "\n"
        )
    print(
        f"Worst errors over the resolvable F0s: F3 {resolvable['f3_err_pct'].abs().max():.1f} %, "
        f"F4 {resolvable['f4_err_pct'].abs().max():.1f} %.\n"
    )
    print(table.round(3).to_markdown(index=False))


if __name__ == "__main__":
    main()
