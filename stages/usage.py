"""Stage usage: what every system's calls used and cost (audio seconds, tokens by kind, money)."""

from voicebias import config
from voicebias.errors import guarded
from voicebias.params import stage_params
from voicebias.pipeline.usage import run_stage

if __name__ == "__main__":
    guarded(
        run_stage,
        stage_params("usage"),
        responses_dir_for=config.responses_dir,
        continuum_responses_dir_for=config.continuum_responses_dir,
        continuations_for=config.continuation_responses,
        manifests=[config.STIMULI_MANIFEST, config.CONTINUUM_MANIFEST, config.PHONATION_MANIFEST],
        cards_dir=config.CARDS_DIR,
        out_dir=config.USAGE_DIR,
        stage="usage",
    )
