"""Stage acoustic_scoring: measure one system's output audio and its deltas against the inputs."""

import argparse

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.acoustic_scoring import run_stage

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--system", required=True)
    a = ap.parse_args()
    guarded(
        run_stage,
        stage_params("acoustic_scoring"),
        system=a.system,
        responses_root=config.RESPONSES_DIR,
        inputs_path=config.INPUT_MEASURES,
        reference_path=config.COMPOSITE_REFERENCE,
        out_path=config.acoustic_table(a.system),
        root=config.ROOT,
        cache_dir=config.MEASURE_CACHE,
        stage=f"acoustic_scoring {a.system}",
    )
