"""Stage usage: what every system's calls used and cost (audio seconds, tokens by kind, money)."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.usage import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("usage"),
        responses_for=lambda system, task: config.responses_dir(system, task) / "responses.csv",
        continuum_responses_for=lambda system, task: config.continuum_responses_dir(system, task) / "responses.csv",
        continuations_for=config.continuation_responses,
        manifests=[config.STIMULI_MANIFEST, config.CONTINUUM_MANIFEST, config.PHONATION_MANIFEST],
        cards_dir=config.CARDS_DIR,
        out_dir=config.USAGE_DIR,
        stage="usage",
    )
