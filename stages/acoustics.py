"""Stage acoustics: measure every input stimulus (F0, formants, classifier margins, composite)."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.acoustics import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("acoustics"),
        config.STIMULI_MANIFEST,
        config.INPUT_MEASURES,
        config.COMPOSITE_REFERENCE,
        config.ROOT,
        config.MEASURE_CACHE,
        stage="acoustics",
    )
