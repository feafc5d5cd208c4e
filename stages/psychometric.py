"""Stage psychometric: psychometric functions of every system's continuum answers, planted beside recovered."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.psychometric import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("psychometric"),
        manifest_path=config.CONTINUUM_MANIFEST,
        responses_dir_for=config.continuum_responses_dir,
        out_dir=config.PSYCHOMETRIC_DIR,
        metrics_path=config.PSYCHOMETRIC_METRICS,
        stage="psychometric",
    )
