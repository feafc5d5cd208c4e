"""Stage pending_calls: one file per system saying how many of its calls failed in its last run.

It runs on every `dvc repro` (always_changed in dvc.yaml); respond@SYSTEM and
sc_continue@SYSTEM depend on their system's file, so failed calls are sent again on the
next `dvc repro` (voicebias.pipeline.pending_calls).
"""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.pending_calls import run_stage

if __name__ == "__main__":
    params = stage_params("pending_calls")
    guarded(
        run_stage,
        systems=[*params["run"]["systems"], *params["run"]["sc_systems"]],
        cache_dir=config.RESPONSE_CACHE,
        out_dir=config.PENDING_CALLS,
        stage="pending_calls",
    )
