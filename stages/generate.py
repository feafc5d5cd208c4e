"""Stage generate: extend the passage bank with a writer model and a judge panel (off by default)."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.generate import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("generate"),
        bank_dir=config.BANK_DIR,
        out_dir=config.GENERATED_DIR,
        metrics_path=config.GENERATE_METRICS,
        stage="generate",
    )
