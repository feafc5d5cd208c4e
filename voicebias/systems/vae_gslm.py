"""VAE-GSLM (b04901014/vae-gslm): speech continuation from the user's checkout, in its own environment.

Driver: drivers/vae_gslm_driver.py, which runs the repository's scripts on a one-file
dataset per prompt (scripts.hubert_kmeans for the prompt's semantic tokens, then
scripts.infer with configs/infer/speech/vae-gslm.yaml pointed at it) and returns the
continuation without the re-synthesised prompt. `weights` is the folder holding
vae-gslm_ckpt/, vocoder_ckpt/, kmeans_v200.npy and hubert-large-ll60k/ (see
docs/repository-systems.md). It reproduces the prompt speaker's voice; the runner
transcribes the continuation (params `asr`). A `command` in the params replaces the
driver (one process per prompt; placeholders as in :mod:`voicebias.systems.repository`).
"""

from voicebias.systems.repository import RepositoryContinuationSystem


class VAEGSLMSystem(RepositoryContinuationSystem):
    repo = "b04901014/vae-gslm"
    driver = "vae_gslm_driver.py"
