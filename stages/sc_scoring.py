"""Stage sc_scoring: voice quality, speaker similarity and judge scores of one system's continuations."""

import argparse

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.sc_scoring import run_stage

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--system", required=True)
    a = ap.parse_args()
    guarded(
        run_stage,
        stage_params("sc_scoring"),
        a.system,
        config.continuation_responses(a.system),
        config.PHONATION_MANIFEST,
        config.sc_scored_table(a.system),
        config.ROOT,
        config.JUDGE_CACHE,
        config.MEASURE_CACHE,
        config.EMBEDDING_CACHE,
        stage=f"sc_scoring {a.system}",
    )
