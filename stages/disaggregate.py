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
        scored_paths=[config.scored_table(s) for s in systems],
        acoustic_paths=[config.acoustic_table(s) for s in systems],
        sc_paths=[config.sc_scored_table(s) for s in params["run"].get("sc_systems") or []],
        out_dir=config.DISAGGREGATED_DIR,
        stage="disaggregate",
    )
