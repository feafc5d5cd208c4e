"""Stage phonation_check: the manipulation check of the phonation conversion (GE gate)."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.phonation_check import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("phonation_check"),
        manifest_path=config.PHONATION_MANIFEST,
        out_dir=config.PHONATION_REPORTS,
        metrics_path=config.CHECK_METRICS,
        root=config.ROOT,
        measure_cache=config.MEASURE_CACHE,
        embedding_cache=config.EMBEDDING_CACHE,
        stage="phonation_check",
    )
