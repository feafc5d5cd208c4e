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
        system=a.system,
        responses_path=config.continuation_responses(a.system),
        manifest_path=config.PHONATION_MANIFEST,
        out_path=config.sc_scored_table(a.system),
        root=config.ROOT,
        cache_dir=config.JUDGE_CACHE,
        measure_cache=config.MEASURE_CACHE,
        embedding_cache=config.EMBEDDING_CACHE,
        stage=f"sc_scoring {a.system}",
    )
