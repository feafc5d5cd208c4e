"""Stage phonation_check: the manipulation check of the phonation conversion (GE gate)."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.phonation_check import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("phonation_check"),
        config.PHONATION_MANIFEST,
        config.PHONATION_REPORTS,
        config.CHECK_METRICS,
        config.ROOT,
        config.MEASURE_CACHE,
        config.EMBEDDING_CACHE,
        stage="phonation_check",
    )
