"""Stage params: validate params.yaml against the schema before any other stage runs."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.pipeline.params import run_stage

if __name__ == "__main__":
    guarded(run_stage, params_path=config.PARAMS, out_path=config.PARAMS_CHECK, stage="params")
