"""Stage analysis: RQ1 and RQ2 statistics for every system, with planted truth beside them."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.analysis import run_stage

if __name__ == "__main__":
    params = stage_params("analysis")
    systems = params["run"]["systems"]
    guarded(
        run_stage,
        params,
        scored_paths=[config.scored_table(s) for s in systems],
        acoustic_paths=[config.acoustic_table(s) for s in systems],
        planted_truth_paths={s: config.respond_planted_truth(s) for s in systems},
        out_dir=config.ANALYSIS_DIR,
        stage="analysis",
    )
