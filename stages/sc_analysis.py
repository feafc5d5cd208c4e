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
        scored_paths=paths,
        prompt_measures_path=config.PHONATION_MEASURES,
        out_dir=config.SC_REPORTS,
        metrics_path=config.SC_METRICS,
        continue_stats=[config.continuation_report(s) for s in params["run"]["sc_systems"]],
        stage="sc_analysis",
    )
