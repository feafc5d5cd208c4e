"""Stage scoring: parse one system's transcripts (describe words, pronouns)."""

import argparse

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.scoring import run_stage

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--system", required=True)
    a = ap.parse_args()
    params = stage_params("scoring")
    guarded(
        run_stage,
        system=a.system,
        tasks=params["tasks"]["names"],
        responses_root=config.RESPONSES_DIR,
        out_path=config.scored_table(a.system),
        stage=f"scoring {a.system}",
    )
