"""Stage bank: read and validate the passage bank into data/passages/passages.csv."""

from voicebias import config
from voicebias.bank import run_stage
from voicebias.errors import guarded

if __name__ == "__main__":
    guarded(run_stage, config.load_params(), config.BANK_DIR, config.PASSAGES,
            config.REPORTS / "bank" / "metrics.json", stage="bank")
