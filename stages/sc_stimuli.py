"""Stage sc_stimuli: voice the speech-continuation prompts (NOP_set, SS_set) with the SC voices."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.sc_stimuli import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("sc_stimuli"),
        out_dir=config.SC_STIMULI_DIR,
        metrics_path=config.SC_STIMULI_METRICS,
        root=config.ROOT,
        stage="sc_stimuli",
    )
