"""VAE-GSLM (b04901014/vae-gslm): speech continuation from the user's checkout, in its own environment.

The repository runs inference through scripts/infer.py with a YAML config
(configs/infer/speech/vae-gslm.yaml), so this adapter runs the command given in
`systems.<name>.command` once per prompt (placeholders as for speechgpt). It
reproduces the prompt speaker's voice; the runner transcribes the continuation
(params `asr`).
"""

from voicebias.systems.repository import RepositoryContinuationSystem


class VAEGSLMSystem(RepositoryContinuationSystem):
    repo = "b04901014/vae-gslm"
    driver = None
