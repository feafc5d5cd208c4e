"""Stage phonation: breathy, creaky and end-creak versions of the selected SC stimuli."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.phonation import run_stage

if __name__ == "__main__":
    guarded(run_stage, config.load_params(), config.SC_STIMULI_DIR / "manifest.csv", config.PHONATION_DIR,
            config.REPORTS / "phonation" / "metrics.json", config.ROOT, stage="phonation")
