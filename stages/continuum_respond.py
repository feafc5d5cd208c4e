"""Stage continuum_respond@SYSTEM: one system's describe and summarize answers on the voice continuum."""

import argparse

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.continuum_respond import run_stage

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--system", required=True)
    a = ap.parse_args()
    guarded(
        run_stage,
        stage_params("continuum_respond"),
        system=a.system,
        manifest_path=config.CONTINUUM_MANIFEST,
        passages_path=config.PASSAGES,
        gate_metrics=config.CONTINUUM_METRICS,
        responses_dir_for=lambda task: config.continuum_responses_dir(a.system, task),
        report_for=lambda task: config.continuum_respond_report(a.system, task),
        cache_dir=config.RESPONSE_CACHE,
        root=config.ROOT,
        render_cache=config.RENDER_CACHE,
        stage=f"continuum_respond {a.system}",
    )
