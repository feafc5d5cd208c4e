"""Stage sc_continue: run one continuation system over every phonation stimulus (cached, resumable)."""

import argparse

from voicebias import config
from voicebias.errors import guarded, stage_params
from voicebias.pipeline.sc_continue import run_stage

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--system", required=True)
    a = ap.parse_args()
    guarded(run_stage, stage_params("sc_continue"), a.system, config.PHONATION_DIR / "manifest.csv",
            config.REPORTS / "phonation" / "check_metrics.json", config.CONTINUATIONS_DIR / a.system,
            config.REPORTS / "sc_continue" / f"{a.system}.json", config.CACHE_DIR / "responses", config.ROOT,
            stage=f"sc_continue {a.system}")
