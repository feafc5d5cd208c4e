"""Stage respond@SYSTEM: run one system on every task over every stimulus (cached, resumable).

The system is built once for all the tasks of `tasks.names`; `--task` (repeatable) runs
only the named tasks, outside DVC.
"""

import argparse

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.respond import run_system_stage

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--system", required=True)
    ap.add_argument("--task", action="append", help="run only this task (repeatable; default: tasks.names)")
    a = ap.parse_args()
    guarded(
        run_system_stage,
        stage_params("respond"),
        a.system,
        config.STIMULI_MANIFEST,
        config.PASSAGES,
        config.GATE_METRICS,
        lambda task: config.responses_dir(a.system, task),
        lambda task: config.respond_report(a.system, task),
        config.RESPONSE_CACHE,
        config.ROOT,
        a.task,
        config.RENDER_CACHE,
        stage=f"respond {a.system}",
    )
