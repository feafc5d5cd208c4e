"""False-positive rates of the SC voice-quality models under a null, over a grid of
prompt x system SD 0, 0.2 and 0.5 dB and 3 and 6 voices per gender.

    .venv/bin/python benchmarks/sc_vq_null.py --runs 400

Each design (tests/unit/analysis/test_sc_generalising.py, `prompt_level_vq`): 8 prompts x 2 phonation
conditions x 2 systems, no average system or gender difference in d = continuation - prompt, voice,
voice x phonation, prompt and prompt x phonation SDs 0.3/0.2/0.3/0.2 dB, voice x system and
voice x phonation x system 0.1 dB, residual 0.4 dB. Printed: the share of designs in which
source:system and source:voice_gender reach p < .05, for the model over voices and prompts
(sc_stats.GENERALISING_MODEL) and the cell-mean model with prompts fixed; docs/analysis.md quotes it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.analysis.test_sc_generalising import prompt_level_vq  # noqa: E402
from voicebias.analysis.sc_stats import GENERALISING_MODEL, voice_quality_models  # noqa: E402
from voicebias.parallel import map_processes  # noqa: E402

KEYS = (
    ("gs", GENERALISING_MODEL, "source:system"),
    ("cs", "continuation - prompt", "source:system"),
    ("gg", GENERALISING_MODEL, "source:voice_gender"),
    ("cg", "continuation - prompt", "source:voice_gender"),
)


def design(task: tuple[int, float, int]) -> dict[str, float]:
    """The four p-values of one simulated design (voices per gender, prompt x system SD, seed)."""
    voices, sd, seed = task
    vq = prompt_level_vq(
        90000 + 1000 * voices + int(100 * sd) * 7 + seed,
        voices=voices,
        prompts=8,
        sd={"prompt:system": sd, "voice:system": 0.1, "voice:phonation:system": 0.1},
    )
    t3 = voice_quality_models(vq, measures=["h1_h2_db"])["type3"].set_index(["model", "term"])
    return {key: float(t3.loc[(model, term), "p_value"]) for key, model, term in KEYS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=100)
    a = ap.parse_args()
    cells = [(voices, sd) for voices in (3, 6) for sd in (0.0, 0.2, 0.5)]
    tasks = [(voices, sd, seed) for voices, sd in cells for seed in range(a.runs)]
    # the designs are independent: one per task on every core
    results = dict(zip(tasks, map_processes(design, tasks, desc="designs")))
    print(
        "| voices per gender | prompt x system SD (dB) | designs | system: over voices and prompts "
        "| system: prompts fixed | gender: over voices and prompts | gender: prompts fixed |"
    )
    print("|---|---|---|---|---|---|---|")
    for voices, sd in cells:
        hits = {k: [0, 0] for k, _, _ in KEYS}
        for seed in range(a.runs):
            for key, p in results[(voices, sd, seed)].items():
                if np.isfinite(p):
                    hits[key][1] += 1
                    hits[key][0] += p < 0.05
        cell = {k: f"{h[0] / h[1]:.3f} ({h[1]})" if h[1] else "– (0)" for k, h in hits.items()}
        print(f"| {voices} | {sd} | {a.runs} | {cell['gs']} | {cell['cs']} | {cell['gg']} | {cell['cg']} |")


if __name__ == "__main__":
    main()
