"""Stage respond@SYSTEM: run one system on every task over every stimulus (cached, resumable).

The system is built once for all the tasks of `tasks.names`; `--task` (repeatable) runs
only the named tasks, outside DVC.
"""

import argparse

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.respond import run_stage

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--system", required=True)
    ap.add_argument("--task", action="append", help="run only this task (repeatable; default: tasks.names)")
    a = ap.parse_args()
    guarded(
        run_stage,
        stage_params("respond"),
        system=a.system,
        manifest_path=config.STIMULI_MANIFEST,
        passages_path=config.PASSAGES,
        gate_metrics=config.GATE_METRICS,
        responses_dir_for=lambda task: config.responses_dir(a.system, task),
        report_for=lambda task: config.respond_report(a.system, task),
        planted_truth_path=config.respond_planted_truth(a.system),
        cache_dir=config.RESPONSE_CACHE,
        root=config.ROOT,
        render_cache=config.RENDER_CACHE,
        task_names=a.task,
        stage=f"respond {a.system}",
    )
