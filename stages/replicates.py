"""Stage replicates: the chosen tasks run again under new seeds, and each result's spread over the runs."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.replicates import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("replicates"),
        manifest_path=config.STIMULI_MANIFEST,
        passages_path=config.PASSAGES,
        gate_metrics=config.GATE_METRICS,
        scored_for=config.scored_table,
        acoustic_for=config.acoustic_table,
        inputs_path=config.INPUT_MEASURES,
        reference_path=config.COMPOSITE_REFERENCE,
        disaggregated_path=config.DISAGGREGATED,
        data_dir=config.REPLICATES_DATA,
        cache_dir=config.RESPONSE_CACHE,
        measure_cache=config.MEASURE_CACHE,
        root=config.ROOT,
        out_dir=config.REPLICATES_DIR,
        render_cache=config.RENDER_CACHE,
        stage="replicates",
    )
