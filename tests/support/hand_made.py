"""Small hand-made tracking inputs: the analysis tables of one system in en and es, the
carrier gate, a stimulus manifest and a dvc.lock, as log_pipeline_run reads them, and
the store log_pipeline_run fills from them.

Shared by the tests that read a store logged from them back through `mlflow server`.
"""

from __future__ import annotations

import math

import pandas as pd

from tests.support.tracking import rq1_rows
from voicebias import config
from voicebias.io import write_json, write_table
from voicebias.params import load_params
from voicebias.report.tracking import log_pipeline_run

SYSTEM = "content_driven"
NAN = float("nan")


def hand_made_outputs(root):
    """Analysis tables of one system in en and es (describe, summarize, readback), the gate,
    the manifest and a dvc.lock naming the stimuli and the responses."""
    analysis = root / "reports" / "analysis"
    langs = ("en", "es")
    write_table(
        analysis / "compliance.csv",
        pd.DataFrame(
            [
                {"system": SYSTEM, "lang": lang, "task": task, "n": 12, "failed": i, "non_compliant": 1}
                for lang in langs
                for i, task in enumerate(("describe", "summarize", "readback"))
            ]
        ),
    )
    firth = {"firth_odds_ratio": 9.5, "firth_ci_low": 2.5, "firth_ci_high": 40.0, "firth_p_value": 0.0015}
    write_table(
        analysis / "describe_odds_ratios.csv",
        pd.DataFrame(
            [
                {
                    "system": SYSTEM,
                    "lang": "ALL",
                    "n": 24,
                    "n_excluded": 0,
                    "odds_ratio": 12.25,
                    "ci_low": 3.5,
                    "ci_high": 42.875,
                    "p_value": 0.000125,
                    "coef": math.log(12.25),
                    "se": 0.64,
                    "fit_status": "ok",
                    **firth,
                },
                {
                    "system": SYSTEM,
                    "lang": "en",
                    "n": 12,
                    "n_excluded": 0,
                    "odds_ratio": 8.0,
                    "ci_low": 1.5,
                    "ci_high": 42.5,
                    "p_value": 0.0142,
                    "coef": math.log(8.0),
                    "se": 0.85,
                    "fit_status": "ok",
                    **firth,
                },
                {
                    "system": SYSTEM,
                    "lang": "es",
                    "n": 11,
                    "n_excluded": 1,
                    "odds_ratio": NAN,
                    "ci_low": NAN,
                    "ci_high": NAN,
                    "p_value": NAN,
                    "coef": NAN,
                    "se": NAN,
                    "fit_status": "perfect separation (complete)",
                    **firth,
                },
            ]
        ),
    )
    write_table(
        analysis / "describe_misgender.csv",
        pd.DataFrame(
            [
                {
                    "system": SYSTEM,
                    "lang": lang,
                    "cell_type": cell,
                    "n": 4,
                    "n_excluded": 0,
                    "misgendered": k,
                    "rate": k / 4,
                }
                for lang in ("ALL", *langs)
                for k, cell in enumerate(("aligned", "neutral", "misaligned"))
            ]
        ),
    )
    pron = {
        "n": 12,
        "n_injecting": 11,
        "n_both": 0,
        "injection_rate": 11 / 12,
        "p_she_masculine": 0.125,
        "p_she_neutral": 0.5,
        "p_she_feminine": 0.875,
        "delta_pp": 75.0,
        "delta_pp_male_voice": 70.0,
        "delta_pp_female_voice": 80.0,
    }
    write_table(analysis / "summarize_pronouns.csv", pd.DataFrame([{"system": SYSTEM, **pron}]))
    write_table(
        analysis / "summarize_pronouns_by_lang.csv",
        pd.DataFrame([{"system": SYSTEM, "lang": lang, **pron, "delta_pp": 75.0 + i} for i, lang in enumerate(langs)]),
    )
    write_table(
        analysis / "rq1_mixed_models.csv",
        pd.DataFrame(
            [
                r
                for k, (lang, task) in enumerate((lang, task) for lang in langs for task in ("summarize", "readback"))
                for r in rq1_rows(SYSTEM, lang, task, k)
            ]
        ),
    )
    gate = root / "reports" / "carrier_gate"
    write_json(gate / "metrics.json", {"passed": True, "flips": 0})
    write_table(gate / "gate.csv", pd.DataFrame([{"lang": "en", "verdict": "pass"}]))
    manifest = root / "data" / "stimuli" / "manifest.csv"
    write_table(manifest, pd.DataFrame({"stimulus_id": ["a", "b"], "sha256": ["1" * 64, "2" * 64]}))
    lock = {
        "schema": "2.0",
        "stages": {
            "stimuli": {
                "cmd": "python -m stages.stimuli",
                "outs": [{"path": "data/stimuli", "hash": "md5", "md5": "5" * 32 + ".dir", "size": 10, "nfiles": 3}],
            }
        },
    }
    lock["stages"][f"respond@{SYSTEM}"] = {
        "cmd": "python -m stages.respond",
        "outs": [
            {"path": f"data/responses/{SYSTEM}", "hash": "md5", "md5": "0" * 32 + ".dir"},
            {"path": f"reports/respond/{SYSTEM}", "hash": "md5", "md5": "1" * 32 + ".dir"},
        ],
    }
    import yaml

    (root / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    return analysis, gate, manifest


def hand_made_store(root):
    """(store URI, analysis folder, log_pipeline_run's summary) of a sqlite store under
    root/mlruns logged from `hand_made_outputs(root)` with the embedded profile."""
    params = load_params(config.ROOT / "profiles" / "embedded.yaml")
    params["run"]["systems"] = [SYSTEM]
    uri = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    params["tracking"]["tracking_uri"] = uri
    analysis, gate, manifest = hand_made_outputs(root)
    summary = log_pipeline_run(params, analysis, gate, manifest, root / "mlruns" / "pipeline_state.json", root=root)
    return uri, analysis, summary
