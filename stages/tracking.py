"""Stage tracking: log this pipeline run (parent) and every system x language x task (children) to MLflow."""

from voicebias import config
from voicebias.errors import guarded, stage_params
from voicebias.pipeline.tracking import run_stage

if __name__ == "__main__":
    guarded(run_stage, stage_params("tracking"), config.REPORTS / "analysis", config.REPORTS / "carrier_gate",
            config.STIMULI_MANIFEST, config.TRACKING_MARKER,
            sc_dir=config.REPORTS / "sc", phonation_dir=config.REPORTS / "phonation", stage="tracking")
