"""Stage replicates@SYSTEM: the chosen tasks run again under new seeds, and each result's spread over the runs."""

import argparse

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.replicates import run_stage

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--system", required=True)
    a = ap.parse_args()
    guarded(
        run_stage,
        stage_params("replicates"),
        system=a.system,
        manifest_path=config.STIMULI_MANIFEST,
        passages_path=config.PASSAGES,
        gate_metrics=config.GATE_METRICS,
        scored_path=config.scored_table(a.system),
        acoustic_path=config.acoustic_table(a.system),
        inputs_path=config.INPUT_MEASURES,
        reference_path=config.COMPOSITE_REFERENCE,
        data_dir=config.replicates_data(a.system),
        cache_dir=config.RESPONSE_CACHE,
        measure_cache=config.MEASURE_CACHE,
        root=config.ROOT,
        out_dir=config.replicates_reports(a.system),
        render_cache=config.RENDER_CACHE,
        stage=f"replicates {a.system}",
    )
