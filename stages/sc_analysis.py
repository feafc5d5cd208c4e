"""Stage sc_analysis: the speech-continuation analyses over all continuation systems."""

from voicebias import config
from voicebias.errors import guarded, stage_params
from voicebias.pipeline.sc_analysis import run_stage

if __name__ == "__main__":
    params = stage_params("sc_analysis")
    paths = [config.SC_SCORED_DIR / f"{s}.csv" for s in params["run"]["sc_systems"]]
    guarded(run_stage, params, paths, config.REPORTS / "phonation" / "measures.csv", config.REPORTS / "sc",
            config.REPORTS / "sc_metrics.json",
            [config.REPORTS / "sc_continue" / f"{s}.json" for s in params["run"]["sc_systems"]], stage="sc_analysis")
