"""Hand-made rows of the RQ1 tables the tracking tests log to MLflow."""

from __future__ import annotations

RQ1_MEASURES = ("delta_f0_median_st", "net_f0_median_st")


def rq1_rows(system, lang, task, k):
    """Hand-made rows of rq1_mixed_models.csv for one system x language x task; k varies the numbers."""
    rows = []
    for j, measure in enumerate(RQ1_MEASURES):
        x = 0.1 * (k + 1) + 0.01 * j
        rows.append(
            {
                "system": system,
                "lang": lang,
                "task": task,
                "task_group": "same-language",
                "measure": measure,
                "units": "st",
                "n": 60,
                "stereotype_effect_est": x,
                "stereotype_effect_se": 0.05,
                "stereotype_effect_df": 27.0,
                "stereotype_effect_ci_low": x - 0.1,
                "stereotype_effect_ci_high": x + 0.1,
                "stereotype_effect_p": 0.02 + 0.001 * k,
                "misaligned_minus_neutral_est": -x,
                "misaligned_minus_neutral_se": 0.07,
                "misaligned_minus_neutral_df": 40.0,
                "misaligned_minus_neutral_ci_low": -x - 0.14,
                "misaligned_minus_neutral_ci_high": -x + 0.14,
                "misaligned_minus_neutral_p": 0.3,
                "chi2_interaction": 6.0 + k,
                "df": 2,
                "f_interaction": 3.0 + k,
                "den_df_interaction": 27.0,
                "p_interaction": 0.05 / (k + 1),
                "converged": j == 0,
                "warning": None if j == 0 else "singular fit",
            }
        )
    return rows
