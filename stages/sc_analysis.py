"""Stage sc_analysis: the speech-continuation analyses over all continuation systems."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.sc_analysis import run_stage

if __name__ == "__main__":
    params = stage_params("sc_analysis")
    paths = [config.sc_scored_table(s) for s in params["run"]["sc_systems"]]
    guarded(
        run_stage,
        params,
        paths,
        config.PHONATION_MEASURES,
        config.SC_REPORTS,
        config.SC_METRICS,
        [config.continuation_report(s) for s in params["run"]["sc_systems"]],
        stage="sc_analysis",
    )
