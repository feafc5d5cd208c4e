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
from voicebias.parallel import map_processes  # noqa: E402


def fit(task: tuple[int, tuple[float, float, float], int]) -> dict[str, float] | None:
    """Coverage and rejection of one simulated audit (voices per gender, planted b, seed); None when
    the fit has no estimate."""
    voices, b, seed = task
    out = describe_glmm_scope(crossed(seed, voices, b=b), "s", "en").set_index("term")
    if (out["status"] != "ok").any():
        return None
    res = {}
    for term, true in (("content_step", b[1]), ("voice_female", b[2])):
        r = out.loc[term]
        res[f"cover_{term}"] = float(r["ci_low"] <= np.exp(true) <= r["ci_high"])
        res[f"reject_{term}"] = float(r["p_value"] < 0.05)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=400)
    a = ap.parse_args()
    cells = [(voices, b) for voices in (3, 6) for b in ((-1.0, 0.8, 0.7), (-1.0, 0.0, 0.0))]
    first = {(voices, b): 5000 + 100000 * voices + int(10 * b[1]) for voices, b in cells}
    tasks = [(voices, b, seed) for voices, b in cells for seed in range(first[voices, b], first[voices, b] + a.runs)]
    # the audits are independent: one per task on every core
    results = map_processes(fit, tasks, desc="audits")
    print(
        "| voices per gender | planted (b1, b2) | fitted | coverage step | coverage voice "
        "| reject step | reject voice |"
    )
    print("|---|---|---|---|---|---|---|")
    for voices, b in cells:
        fitted = [r for (v, bb, _), r in zip(tasks, results) if (v, bb) == (voices, b) and r is not None]
        mean = {k: np.mean([r[k] for r in fitted]) for k in fitted[0]} if fitted else {}
        keys = ("cover_content_step", "cover_voice_female", "reject_content_step", "reject_voice_female")
        shares = " | ".join(f"{mean[k]:.3f}" for k in keys)
        print(f"| {voices} | ({b[1]}, {b[2]}) | {len(fitted)}/{a.runs} | {shares} |")


if __name__ == "__main__":
    main()
