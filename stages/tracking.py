"""Stage tracking: log this pipeline run (parent, with the audit card and the report) and every system x
language x task (children) to MLflow."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.tracking import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("tracking"),
        analysis_dir=config.ANALYSIS_DIR,
        gate_dir=config.CARRIER_GATE_DIR,
        manifest_path=config.STIMULI_MANIFEST,
        out_path=config.TRACKING_MARKER,
        sc_dir=config.SC_REPORTS,
        phonation_dir=config.PHONATION_REPORTS,
        report_dir=config.REPORT_DIR,
        disaggregated=config.DISAGGREGATED,
        psychometric=config.PSYCHOMETRIC_TABLE,
        usage=config.USAGE_TABLE,
        stage="tracking",
    )
