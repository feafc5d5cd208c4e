"""Calibration of the psychometric content shift (voicebias.analysis.psychometric) on simulated
continuum audits with planted truth: coverage of the 95 % Fieller interval of
PSE(feminine) - PSE(masculine), and the share of p < .05 when no shift is planted.

    .venv/bin/python benchmarks/psychometric_calibration.py --runs 500

Each audit (tests/support/continuum_design.py): a 7-step continuum 120-220 Hz (10.5 st),
10 passages per content pole, each voiced from `voices` male and `voices` female base voices,
one answer per passage x base voice x step; slope 0.6 log-odds per st, masculine PSE 6 st,
passage SD 0.5, base-voice SD 0.3. Printed as a markdown table; docs/psychometric.md quotes it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from tests.support.continuum_design import CONTINUUM, continuum_answers  # noqa: E402
from voicebias.analysis.psychometric import psychometric_scope  # noqa: E402


def run(voices: int, shift: float, runs: int, seed0: int) -> tuple[float, float, int]:
    cover = reject = fits = 0
    for seed in range(seed0, seed0 + runs):
        row = psychometric_scope(continuum_answers(seed, shift=shift, base_voices=voices), CONTINUUM)
        row = row.set_index("quantity").loc["shift"]
        if row["status"] != "ok" or not np.isfinite(row["ci_low"]):
            continue
        fits += 1
        cover += row["ci_low"] <= shift <= row["ci_high"]
        reject += row["p_value"] < 0.05
    return cover / fits, reject / fits, fits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500)
    args = ap.parse_args()
    print("| base voices per gender | planted shift (st) | coverage of the 95 % CI | p < .05 | fits / audits |")
    print("|---|---|---|---|---|")
    for voices in (1, 2):
        for shift in (-2.0, 0.0):
            cover, reject, fits = run(voices, shift, args.runs, 100_000 * voices + (0 if shift else 50_000))
            print(f"| {voices} | {shift:g} | {cover:.3f} | {reject:.3f} | {fits} / {args.runs} |", flush=True)


if __name__ == "__main__":
    main()
