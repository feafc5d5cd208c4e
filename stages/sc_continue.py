"""Stage sc_continue: run one continuation system over every phonation stimulus (cached, resumable)."""

import argparse

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.sc_continue import run_stage

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--system", required=True)
    a = ap.parse_args()
    guarded(
        run_stage,
        stage_params("sc_continue"),
        system=a.system,
        manifest_path=config.PHONATION_MANIFEST,
        check_metrics=config.CHECK_METRICS,
        excluded_path=config.PHONATION_EXCLUDED,
        out_dir=config.continuations_dir(a.system),
        stats_path=config.continuation_report(a.system),
        cache_dir=config.RESPONSE_CACHE,
        root=config.ROOT,
        stage=f"sc_continue {a.system}",
    )
