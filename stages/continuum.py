"""Stage continuum: the selected passages' voices moved along a male-to-female continuum, checked."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.continuum import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("continuum"),
        stimuli_manifest_path=config.STIMULI_MANIFEST,
        out_dir=config.CONTINUUM_DIR,
        metrics_path=config.CONTINUUM_METRICS,
        root=config.ROOT,
        stage="continuum",
    )
