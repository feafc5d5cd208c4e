"""Stage analysis: RQ2 statistics for every system, with planted truth beside them."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.analysis import run_stage

if __name__ == "__main__":
    params = stage_params("analysis")
    systems = params["run"]["systems"]
    paths = [config.scored_table(s) for s in systems]
    acoustic = [config.acoustic_table(s) for s in systems]
    guarded(run_stage, params, paths, config.ANALYSIS_DIR, acoustic, stage="analysis")
