"""Every fit the pipeline makes gives the same categories when its inputs move by 1e-9.

Another processor's kernels change the last bits of the measures, embeddings and scores a fit
receives. The pipeline's statuses, reasons, convergence flags, warnings, separation verdicts,
"no spread" switches and planted-recovered verdicts must not hinge on them: each fit family runs
here on the reproduced workspace's own tables, then again with every float input multiplied by 1
+ 1e-9 x (random sign), and every non-numeric column and every count must be the same, and every
p-value must agree to 1e-4. The fit families: describe (maximum-likelihood logit and Firth,
separation check), RQ1 (Welch contrasts, REML mixed models with Satterthwaite df, pooled
contrasts, significance counts), SC (REML mixed models with type-3 tests and contrasts,
retention bootstrap, judge beta regression, planted vs recovered) and the disaggregated
bootstrap tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from voicebias.io import read_json, read_table

RELATIVE = 1e-9
SEEDS = (1, 2)
# printed numbers (variance components at 4 significant digits), not categories
NUMBER_TEXT = {"variance_components"}


def perturb(df: pd.DataFrame, seed: int) -> pd.DataFrame:
    """`df` with every float column multiplied by 1 + 1e-9 x a random sign per value."""
    rng = np.random.default_rng(seed)
    out = df.copy()
    for col in out.columns:
        if pd.api.types.is_float_dtype(out[col]):
            out[col] = out[col] * (1 + RELATIVE * rng.choice([-1.0, 1.0], len(out)))
    return out


def categories(table: pd.DataFrame) -> pd.DataFrame:
    """The columns printed as categories or counts: everything but floats and printed numbers."""
    cols = [c for c in table.columns if c not in NUMBER_TEXT and not pd.api.types.is_float_dtype(table[c])]
    return table[cols].reset_index(drop=True)


def assert_same_categories(name: str, base: pd.DataFrame, again: pd.DataFrame) -> None:
    assert len(base) == len(again), name
    a, b = categories(base), categories(again)
    assert list(a.columns) == list(b.columns), name
    # a missing value (None, NaN) is the same category as a missing value
    diff = ((a.astype(str) != b.astype(str)) & ~(a.isna() & b.isna())).any(axis=1)
    assert not diff.any(), (
        f"{name}: categories moved under a 1e-9 perturbation:\n"
        f"{pd.concat([a[diff], b[diff]], keys=['base', 'perturbed']).to_string()}"
    )
    # and every p-value (what a reader compares with alpha) moves by rounding only
    for col in [c for c in base.columns if c == "p_value" or c.startswith("p_") or c.endswith("_p")]:
        x, y = base[col].to_numpy(float), again[col].to_numpy(float)
        close = np.isclose(x, y, rtol=1e-4, atol=1e-9, equal_nan=True)
        assert close.all(), f"{name}.{col}: p-values moved under a 1e-9 perturbation: {x[~close]} -> {y[~close]}"


def at(repo, path):
    """A path of voicebias.config, in the workspace `repo`."""
    from voicebias import config

    return repo / path.relative_to(config.ROOT)


@pytest.fixture(scope="module")
def inputs(workspace):
    import yaml

    from voicebias import config

    _, repo, res = workspace
    assert res.returncode == 0, res.stdout[-3000:]
    params = yaml.safe_load((repo / "params.yaml").read_text(encoding="utf-8"))
    systems, sc_systems = list(params["run"]["systems"]), list(params["run"]["sc_systems"])

    def concat(paths):
        return pd.concat([read_table(at(repo, p)) for p in paths if at(repo, p).exists()], ignore_index=True)

    return {
        "params": params,
        "scored": concat([config.scored_table(s) for s in systems]),
        "acoustic": concat([config.acoustic_table(s) for s in systems]),
        "sc": concat([config.sc_scored_table(s) for s in sc_systems]),
        "prompt_measures": read_table(at(repo, config.PHONATION_MEASURES)),
        "truths": {
            s: read_json(at(repo, config.continuation_report(s))).get("planted_truth")
            for s in sc_systems
            if at(repo, config.continuation_report(s)).exists()
        },
    }


def test_describe_fits_keep_their_categories(inputs, monkeypatch):
    """The describe logit and Firth fits (per language and pooled) with their design perturbed."""
    from voicebias.analysis import stats as st
    from voicebias.analysis.s2s import describe_misgender, describe_odds_ratios

    scored = inputs["scored"]
    conf = float(inputs["params"]["analyze"]["confidence"])
    base = describe_odds_ratios(scored, conf)
    rates, fisher = describe_misgender(scored, conf)
    assert len(base) and set(base["status"]) <= {"ok", "separation", "not estimable"}
    design = st.describe_design
    for seed in SEEDS:

        def perturbed_design(df, _seed=seed):
            d = design(df)
            rng = np.random.default_rng(_seed)
            for col in ("content_step", "voice_female"):
                d[col] = d[col] * (1 + RELATIVE * rng.choice([-1.0, 1.0], len(d)))
            return d

        monkeypatch.setattr(st, "describe_design", perturbed_design)
        again = describe_odds_ratios(scored, conf)
        monkeypatch.setattr(st, "describe_design", design)
        assert_same_categories("describe_odds_ratios", base, again)
        # the firth and ML estimates themselves move by rounding only
        np.testing.assert_allclose(again["firth_odds_ratio"], base["firth_odds_ratio"], rtol=1e-6)
        r2, f2 = describe_misgender(scored, conf)
        assert_same_categories("describe_misgender", rates, r2)
        assert_same_categories("describe_fisher", fisher, f2)


def test_rq1_fits_keep_their_categories(inputs):
    from voicebias.analysis.rq1 import rq1_contrasts, rq1_mixed_models, rq1_pooled, rq1_significance_counts

    conf = float(inputs["params"]["analyze"]["confidence"])
    measures = ["delta_composite", "delta_f0_median_st", "net_composite", "net_f0_median_st"]

    def run(acoustic):
        mixed = pd.concat([rq1_mixed_models(acoustic, m, conf) for m in measures], ignore_index=True)
        contrasts = pd.concat([rq1_contrasts(acoustic, m) for m in measures], ignore_index=True)
        pooled = pd.concat(
            [rq1_pooled(acoustic, m, conf, pool_systems=p) for p in (False, True) for m in measures], ignore_index=True
        )
        return {
            "rq1_mixed_models": mixed,
            "rq1_contrasts": contrasts,
            "rq1_pooled": pooled,
            "rq1_significance_counts": rq1_significance_counts(contrasts, mixed, 1 - conf),
        }

    base = run(inputs["acoustic"])
    assert (base["rq1_mixed_models"]["status"] == "ok").any()
    for seed in SEEDS:
        again = run(perturb(inputs["acoustic"], seed))
        for name in base:
            assert_same_categories(name, base[name], again[name])
        for col in ("stereotype_effect_df", "den_df_interaction"):
            np.testing.assert_allclose(again["rq1_mixed_models"][col], base["rq1_mixed_models"][col], rtol=1e-4)


def test_sc_fits_keep_their_categories(inputs):
    """SC mixed models, retention bootstrap, judge beta regression and planted-vs-recovered verdicts."""
    from voicebias.analysis.sc import analyse

    seed = int(inputs["params"]["base"]["seed"])
    truths = {k: v for k, v in inputs["truths"].items() if v}
    base = analyse(inputs["sc"], inputs["prompt_measures"], truths, seed=seed)
    assert {"vq_fits", "judge_beta_fits", "retention"} <= set(base)
    for s in SEEDS:
        again = analyse(perturb(inputs["sc"], s), perturb(inputs["prompt_measures"], s + 10), truths, seed=seed)
        assert set(again) == set(base)
        for name in base:
            assert_same_categories(name, base[name], again[name])


def test_disaggregated_bootstrap_keeps_its_categories(inputs):
    from voicebias.analysis.disaggregated import disaggregate, s2s_items, sc_items

    params = inputs["params"]
    kwargs = {
        "resamples": int(params["disaggregate"]["resamples"]),
        "confidence": float(params["analyze"]["confidence"]),
        "seed": int(params["base"]["seed"]),
    }

    def run(scored, acoustic, sc):
        return disaggregate(pd.concat([s2s_items(scored, acoustic), sc_items(sc)], ignore_index=True), **kwargs)

    base = run(inputs["scored"], inputs["acoustic"], inputs["sc"])
    assert (base["ci_method"] == "expanded percentile").any()
    for s in SEEDS:
        again = run(perturb(inputs["scored"], s), perturb(inputs["acoustic"], s + 1), perturb(inputs["sc"], s + 2))
        assert_same_categories("disaggregated", base, again)
