"""False-positive rates of the SC judge analyses under a null: the model over voices and prompts
(sc_stats.judge_mixed_model) and, for comparison, a prompt-clustered beta regression's Wald test
of the terms it leaves untested (gender varies between voices).

    .venv/bin/python benchmarks/sc_judge_null.py --runs 200 --voices 3 6

Each design: 30 prompts x 4 phonation conditions x `voices` voices per gender, one system; the
score of each continuation is Beta(mu phi, (1 - mu) phi) with phi = 20 and logit(mu) the sum of a
voice effect (SD 0.3), a prompt effect (SD 0.3) and a voice x phonation effect (SD 0.1); no gender
or gender x phonation effect. Printed: the share of designs in which gender and gender x phonation
reach p < .05; docs/analysis.md ("SC judge: the model over voices and prompts") quotes it.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from voicebias.analysis.sc_stats import judge_mixed_model  # noqa: E402

PHON = ("modal", "breathy", "creaky", "endcreak")


def design(seed: int, voices: int, prompts: int = 30) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    vs = [(f"{g[0]}{i}", g) for g in ("male", "female") for i in range(voices)]
    a = {v: rng.normal(0, 0.3) for v, _ in vs}
    b = {p: rng.normal(0, 0.3) for p in range(prompts)}
    rows = []
    for v, g in vs:
        c = {ph: rng.normal(0, 0.1) for ph in PHON}
        for p in range(prompts):
            for ph in PHON:
                mu = 1 / (1 + np.exp(-(a[v] + b[p] + c[ph])))
                y = float(np.clip(rng.beta(mu * 20, (1 - mu) * 20), 1e-3, 1 - 1e-3))
                rows.append(
                    {"system": "s", "voice_id": v, "voice_gender": g, "prompt_id": f"p{p}", "phonation": ph, "y": y}
                )
    return pd.DataFrame(rows)


def beta_prompt_clustered(d: pd.DataFrame) -> tuple[float, float]:
    """p of gender and gender x phonation in a full-factorial beta regression, SEs clustered by prompt."""
    from statsmodels.othermod.betareg import BetaModel

    m = BetaModel.from_formula("y ~ C(phonation, Sum) * C(voice_gender, Sum)", d)
    groups = pd.factorize(d["prompt_id"])[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = m.fit(disp=0, maxiter=500, cov_type="cluster", cov_kwds={"groups": groups})
    names, b, V = list(f.params.index), f.params.to_numpy(), f.cov_params().to_numpy()
    out = []
    for term in (lambda n: n.startswith("C(voice_gender"), lambda n: ":" in n):
        i = [k for k, n in enumerate(names) if term(n)]
        stat = float(b[i] @ np.linalg.solve(V[np.ix_(i, i)], b[i])) / len(i)
        out.append(float(stats.f.sf(stat, len(i), len(set(groups)) - 1)))
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--voices", type=int, nargs="+", default=[3, 6])
    a = ap.parse_args()
    print(
        "| voices per gender | designs | gender: mixed | gender x phonation: mixed | gender: beta, prompt-clustered |"
    )
    print("|---|---|---|---|---|")
    for voices in a.voices:
        hits = np.zeros(3)
        for seed in range(a.runs):
            d = design(1000 + seed, voices)
            t3 = judge_mixed_model(d.assign(score=1 + 4 * d["y"]), "score")[0].set_index("term")
            hits += [
                t3.loc["voice_gender", "p_value"] < 0.05,
                t3.loc["voice_gender:phonation", "p_value"] < 0.05,
                beta_prompt_clustered(d)[0] < 0.05,
            ]
        r = hits / a.runs
        print(f"| {voices} | {a.runs} | {r[0]:.3f} | {r[1]:.3f} | {r[2]:.3f} |")


if __name__ == "__main__":
    main()
