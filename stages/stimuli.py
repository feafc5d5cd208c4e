"""Stage stimuli: voice every passage with the configured TTS voices."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.stimuli import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("stimuli"),
        passages_path=config.PASSAGES,
        out_dir=config.STIMULI_DIR,
        root=config.ROOT,
        stage="stimuli",
    )
