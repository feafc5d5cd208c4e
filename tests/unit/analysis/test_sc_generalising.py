"""The SC voice-quality model over voices and prompts (sc_stats._generalising_model): pinned to
lmerTest at test time, and its false-positive rate under a null with prompt x system variation.

Every continuation is a row: d = continuation - prompt with random intercepts for voice,
voice x phonation, prompt, prompt x phonation and, with two systems, voice x system,
voice x phonation x system and prompt x system; REML (lme4), type-III F with Satterthwaite df.

Variance components, F values, df and p agree with lmerTest within 1e-4 (R's bobyqa is run to
rhoend 1e-12, so both fits stop at the same optimum; lmerTest's numerical Hessian then agrees with
voicebias's analytical one to about 1e-6 in these designs).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.support.rref import run_r
from voicebias.analysis.mixed import fit_reml
from voicebias.analysis.sc_stats import GENERALISING_MODEL, prompt_differences, voice_quality_models

PHON = ("breathy", "modal")


def prompt_level_vq(
    seed: int,
    voices: int = 3,
    prompts: int = 8,
    systems: int = 2,
    sd: dict[str, float] | None = None,
    system_effect: float = 0.0,
) -> pd.DataFrame:
    """Prompt and continuation rows (the vq table) with planted random effects on d (dB).

    sd names the SD of each random term of the model (voice, voice:phonation, prompt,
    prompt:phonation, voice:system, voice:phonation:system, prompt:system, residual)."""
    sd = {
        "voice": 0.3,
        "voice:phonation": 0.2,
        "prompt": 0.3,
        "prompt:phonation": 0.2,
        "voice:system": 0.25,
        "voice:phonation:system": 0.15,
        "prompt:system": 0.2,
        "residual": 0.4,
        **(sd or {}),
    }
    rng = np.random.default_rng(seed)
    vs = [(f"m{i}", "male") for i in range(voices)] + [(f"f{i}", "female") for i in range(voices)]
    ps = [f"p{i:02d}" for i in range(prompts)]
    ss = [f"sys{k + 1}" for k in range(systems)]
    eff: dict[tuple, float] = {}

    def e(term: str, *key) -> float:
        k = (term, *key)
        if k not in eff:
            eff[k] = rng.normal(0, sd[term])
        return eff[k]

    rows = []
    for v, g in vs:
        for ph in PHON:
            for p in ps:
                sid = f"{p}-{v}-{ph}"
                prompt_val = rng.normal(0, 1.0) + (2.0 if ph == "breathy" else 0.0)
                common = {"stimulus_id": sid, "prompt_id": p, "voice_id": v, "voice_gender": g, "phonation": ph}
                rows.append({**common, "source": "prompt", "system": np.nan, "h1_h2_db": prompt_val})
                for k, s in enumerate(ss):
                    d = (
                        system_effect * (k - (systems - 1) / 2)
                        + e("voice", v)
                        + e("voice:phonation", v, ph)
                        + e("prompt", p)
                        + e("prompt:phonation", p, ph)
                        + e("voice:system", v, s)
                        + e("voice:phonation:system", v, ph, s)
                        + e("prompt:system", p, s)
                        + rng.normal(0, sd["residual"])
                    )
                    rows.append({**common, "source": "continuation", "system": s, "h1_h2_db": prompt_val + d})
    return pd.DataFrame(rows)


LMER_PROMPTS = r"""
suppressMessages(library(lmerTest))
options(contrasts = c("contr.sum", "contr.poly"))
pr <- vq[vq$source == "prompt", c("stimulus_id", "h1_h2_db")]
names(pr)[2] <- "prompt_value"
d <- merge(vq[vq$source == "continuation", ], pr, by = "stimulus_id")
d$d <- d$h1_h2_db - d$prompt_value
for (f in c("system", "voice_gender", "phonation")) d[[f]] <- factor(d[[f]], levels = sort(unique(d[[f]])))
ctl <- lmerControl(optimizer = "bobyqa", optCtrl = list(rhoend = 1e-12, maxfun = 1e6))
f <- d ~ voice_gender * phonation + (1 | voice_id) + (1 | voice_id:phonation) + (1 | prompt_id) +
  (1 | prompt_id:phonation)
if (length(unique(d$system)) > 1) f <- d ~ system * voice_gender * phonation + (1 | voice_id) +
  (1 | voice_id:phonation) + (1 | prompt_id) + (1 | prompt_id:phonation) + (1 | voice_id:system) +
  (1 | voice_id:phonation:system) + (1 | prompt_id:system)
m <- lmer(f, data = d, REML = TRUE, control = ctl)
a <- anova(m, type = 3, ddf = "Satterthwaite")
emit("terms_n", nrow(a)); emit("F", a[["F value"]]); emit("ddf", a[["DenDF"]]); emit("p", a[["Pr(>F)"]])
s <- summary(m)$coefficients
emit("intercept_F", (s[1, 1] / s[1, 2])^2); emit("intercept_df", s[1, 3])
"""


@pytest.mark.parametrize("systems,seed", [(2, 3), (1, 4), (2, 8)])
def test_generalising_model_matches_lmertest(systems, seed):
    vq = prompt_level_vq(seed, systems=systems)
    out = voice_quality_models(vq, measures=["h1_h2_db"], min_df=0.0)
    t3 = out["type3"]
    g = t3[t3["model"] == GENERALISING_MODEL].reset_index(drop=True)
    r = run_r(LMER_PROMPTS + 'emit("vc", as.data.frame(VarCorr(m))$vcov)', vq=vq)
    # R's anova has no intercept row; its t test on the intercept is the F(1, df) of 'source'
    assert g.loc[0, "term"] == "source"
    assert g.loc[0, "f_value"] == pytest.approx(r["intercept_F"], rel=1e-4)
    assert g.loc[0, "den_df"] == pytest.approx(r["intercept_df"], rel=1e-4)
    rest = g.iloc[1:]
    assert len(rest) == int(r["terms_n"])
    np.testing.assert_allclose(rest["f_value"], r["F"], rtol=1e-4, atol=2e-6)
    np.testing.assert_allclose(rest["den_df"], r["ddf"], rtol=1e-4)
    np.testing.assert_allclose(rest["p_value"], r["p"], rtol=1e-4, atol=1e-10)
    fits = out["fits"].set_index("model")
    rows = prompt_differences(vq, "h1_h2_db")
    v, p, ph, sy = (rows[c].astype(str) for c in ("voice_id", "prompt_id", "phonation", "system"))
    groups = {"voice": v, "voice:phonation": v + ph, "prompt": p, "prompt:phonation": p + ph}
    if systems > 1:
        groups.update({"voice:system": v + sy, "voice:phonation:system": v + ph + sy, "prompt:system": p + sy})
    formula = (
        "d ~ C(system, Sum) * C(voice_gender, Sum) * C(phonation, Sum)"
        if systems > 1
        else ("d ~ C(voice_gender, Sum) * C(phonation, Sum)")
    )
    fit = fit_reml(formula, rows, groups, nobound=False)
    np.testing.assert_allclose(sorted(fit.vcomp), sorted(r["vc"]), rtol=1e-4, atol=1e-8)
    assert fits.loc[GENERALISING_MODEL, "status"] == "ok"
    assert fits.loc[GENERALISING_MODEL, "n_obs"] == 6 * 2 * 8 * systems


def _null_rejections(runs: int) -> tuple[int, int, int]:
    """(generalising rejections, designs it tested, cell-model rejections) of source:system at
    alpha .05 under a null: no average system difference, prompt x system SD 0.5 dB, voice x system
    and voice x phonation x system SD 0.1 dB, 3 voices per gender, 8 prompts."""
    gen, cell, fitted = 0, 0, 0
    for seed in range(runs):
        vq = prompt_level_vq(
            7000 + seed,
            voices=3,
            prompts=8,
            sd={"prompt:system": 0.5, "voice:system": 0.1, "voice:phonation:system": 0.1},
        )
        t3 = voice_quality_models(vq, measures=["h1_h2_db"])["type3"].set_index(["model", "term"])
        pg = t3.loc[(GENERALISING_MODEL, "source:system"), "p_value"]
        pc = t3.loc[("continuation - prompt", "source:system"), "p_value"]
        if np.isfinite(pg):
            fitted += 1
            gen += pg < 0.05
        cell += np.isfinite(pc) and pc < 0.05
    return gen, fitted, cell


def test_system_claims_hold_their_size_with_prompt_by_system_variation_reduced():
    """40 null designs (the slow test runs 200; benchmarks/sc_vq_null.py the full grid): the
    generalising model's source:system test rejects in at most 5 of 40, the cell-mean model with
    prompts fixed in at least 10 (it ignores the prompt x system variation)."""
    gen, fitted, cell = _null_rejections(40)
    assert fitted >= 38
    assert gen <= 5, gen
    assert cell >= 10, cell


@pytest.mark.slow
def test_system_claims_hold_their_size_with_prompt_by_system_variation():
    """200 null designs: the generalising model rejects in at most 8 %."""
    gen, fitted, cell = _null_rejections(200)
    assert fitted >= 190
    assert gen / fitted <= 0.08, gen / fitted
    assert cell / 200 > 0.2


def test_generalising_model_statuses_on_degenerate_tables():
    vq = prompt_level_vq(5)
    no_prompt = vq.drop(columns="prompt_id")
    fits = voice_quality_models(no_prompt, measures=["h1_h2_db"])["fits"].set_index("model")
    assert fits.loc[GENERALISING_MODEL, "status"] == "not estimable"
    assert "prompt_id" in fits.loc[GENERALISING_MODEL, "reason"]
    flat = vq.copy()
    flat.loc[flat["source"] == "continuation", "h1_h2_db"] = flat.loc[
        flat["source"] == "continuation", "stimulus_id"
    ].map(flat[flat["source"] == "prompt"].set_index("stimulus_id")["h1_h2_db"])
    fits = voice_quality_models(flat, measures=["h1_h2_db"])["fits"].set_index("model")
    assert fits.loc[GENERALISING_MODEL, "reason"].startswith("no variance")
