"""Stage acoustics: measure every input stimulus (F0, formants, classifier margins, composite)."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.acoustics import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("acoustics"),
        manifest_path=config.STIMULI_MANIFEST,
        out_measures=config.INPUT_MEASURES,
        out_reference=config.COMPOSITE_REFERENCE,
        root=config.ROOT,
        measure_cache=config.MEASURE_CACHE,
        stage="acoustics",
    )
