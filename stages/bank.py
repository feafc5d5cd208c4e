"""Stage bank: read and validate the passage bank into data/passages/passages.csv."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.bank import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("bank"),
        bank_dir=config.BANK_DIR,
        out_table=config.PASSAGES,
        metrics_path=config.BANK_METRICS,
        stage="bank",
    )
