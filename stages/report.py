"""Stage report: reports/report/audit_card.{md,json} and report.{md,html} (the card first) with figures."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.report import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("report"),
        analysis_dir=config.ANALYSIS_DIR,
        gate_dir=config.CARRIER_GATE_DIR,
        bank_metrics=config.BANK_METRICS,
        out_dir=config.REPORT_DIR,
        sc_dir=config.SC_REPORTS,
        phonation_dir=config.PHONATION_REPORTS,
        disaggregated=config.DISAGGREGATED,
        psychometric_dir=config.PSYCHOMETRIC_DIR,
        usage_table=config.USAGE_TABLE,
        replicates_for=config.replicates_reports,
        stage="report",
    )
