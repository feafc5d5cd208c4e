"""Calibration of the describe mixed model (voicebias.analysis.s2s.describe_glmm_scope) on
simulated audits with planted values: coverage of the 95 % intervals and false-positive rates
at alpha .05 under a null, for 3 and 6 voices per gender.

    .venv/bin/python benchmarks/describe_glmm_calibration.py --runs 400

Each audit: 30 passages (10 per content pole), every passage voiced by every voice, one answer
per passage x voice; logit P(female) = -1 + b1 step + b2 female + voice + passage with voice SD
0.5 and passage SD 0.8. Coverage: b1 = 0.8, b2 = 0.7. Null: b1 = b2 = 0 (each term's rejection
rate). Printed as a markdown table; docs/analysis.md quotes it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.analysis.test_glmm import crossed  # noqa: E402
from voicebias.analysis.s2s import describe_glmm_scope  # noqa: E402


def run(voices: int, b: tuple[float, float, float], runs: int, seed0: int) -> dict[str, float]:
    cover = {"content_step": 0, "voice_female": 0}
    reject = {"content_step": 0, "voice_female": 0}
    fitted = 0
    for seed in range(seed0, seed0 + runs):
        out = describe_glmm_scope(crossed(seed, voices, b=b), "s", "en").set_index("term")
        if (out["status"] != "ok").any():
            continue
        fitted += 1
        for term, true in (("content_step", b[1]), ("voice_female", b[2])):
            r = out.loc[term]
            cover[term] += r["ci_low"] <= np.exp(true) <= r["ci_high"]
            reject[term] += r["p_value"] < 0.05
    return {
        "fitted": fitted,
        **{f"cover_{k}": v / fitted for k, v in cover.items()},
        **{f"reject_{k}": v / fitted for k, v in reject.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=400)
    a = ap.parse_args()
    print(
        "| voices per gender | planted (b1, b2) | fitted | coverage step | coverage voice "
        "| reject step | reject voice |"
    )
    print("|---|---|---|---|---|---|---|")
    for voices in (3, 6):
        for b in ((-1.0, 0.8, 0.7), (-1.0, 0.0, 0.0)):
            r = run(voices, b, a.runs, 5000 + 100000 * voices + int(10 * b[1]))
            print(
                f"| {voices} | ({b[1]}, {b[2]}) | {r['fitted']}/{a.runs} | {r['cover_content_step']:.3f} | "
                f"{r['cover_voice_female']:.3f} | {r['reject_content_step']:.3f} | {r['reject_voice_female']:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
