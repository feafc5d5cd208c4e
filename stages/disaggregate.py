"""Stage disaggregate: every rate and mean by system x language x voice x condition, with bootstrap CIs."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.disaggregate import run_stage

if __name__ == "__main__":
    params = stage_params("disaggregate")
    systems = params["run"]["systems"]
    guarded(
        run_stage,
        params,
        [config.scored_table(s) for s in systems],
        [config.acoustic_table(s) for s in systems],
        [config.sc_scored_table(s) for s in params["run"].get("sc_systems") or []],
        config.DISAGGREGATED_DIR,
        stage="disaggregate",
    )
