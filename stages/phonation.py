"""Stage phonation: breathy, creaky and end-creak versions of the selected SC stimuli."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.phonation import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("phonation"),
        sc_manifest_path=config.SC_STIMULI_MANIFEST,
        out_dir=config.PHONATION_DIR,
        metrics_path=config.PHONATION_METRICS,
        root=config.ROOT,
        stage="phonation",
    )
