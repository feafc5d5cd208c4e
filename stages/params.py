"""Stage params: validate params.yaml against the schema before any other stage runs."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import check_stage

if __name__ == "__main__":
    guarded(check_stage, config.PARAMS, config.REPORTS / "params" / "valid.json", stage="params")
