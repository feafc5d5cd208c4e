"""Stage respond: run one system on one task over every stimulus (cached, resumable)."""

import argparse

from voicebias import config
from voicebias.errors import guarded, stage_params
from voicebias.pipeline.respond import run_stage

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--system", required=True)
    ap.add_argument("--task", required=True)
    a = ap.parse_args()
    guarded(run_stage, stage_params("respond"), a.system, a.task, config.STIMULI_MANIFEST, config.PASSAGES,
            config.GATE_METRICS, config.responses_dir(a.system, a.task),
            config.respond_report(a.system, a.task), config.RESPONSE_CACHE, config.ROOT,
            stage=f"respond {a.system}/{a.task}")
