"""Stage report: reports/report/audit_card.{md,json} and report.{md,html} (the card first) with figures."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.report import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("report"),
        config.ANALYSIS_DIR,
        config.CARRIER_GATE_DIR,
        config.BANK_METRICS,
        config.REPORT_DIR,
        config.SC_REPORTS,
        config.PHONATION_REPORTS,
        disaggregated=config.DISAGGREGATED,
        stage="report",
    )
