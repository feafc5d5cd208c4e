"""Stage carrier_gate: certify the stimuli (H0) or stop the pipeline."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.carrier_gate import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("carrier_gate"),
        measures_path=config.INPUT_MEASURES,
        out_dir=config.CARRIER_GATE_DIR,
        stage="carrier_gate",
    )
