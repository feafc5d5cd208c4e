"""Stage phonation: breathy, creaky and end-creak versions of the selected SC stimuli."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.phonation import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("phonation"),
        config.SC_STIMULI_MANIFEST,
        config.PHONATION_DIR,
        config.PHONATION_METRICS,
        config.ROOT,
        stage="phonation",
    )
