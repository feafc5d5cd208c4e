"""SpeechGPT (0nutation/SpeechGPT): speech continuation from the user's checkout, in its own environment.

Driver: drivers/speechgpt_driver.py, which calls the repository's inference class
(SpeechGPTInference in speechgpt/src/infer/cli_infer.py) once per prompt, the audio
path as the question. `weights` is the folder holding SpeechGPT-7B-cm/,
SpeechGPT-7B-com/, speech2unit/ and vocoder/ (see docs/repository-systems.md);
`variant` SpeechGPT-7B-com adds the chat LoRA. Its output speaker is the unit
vocoder's fixed voice; without text the runner transcribes the continuation
(params `asr`). A `command` in the params replaces the driver (one process per
prompt; placeholders as in :mod:`voicebias.systems.repository`).
"""

from voicebias.systems.repository import RepositoryContinuationSystem


class SpeechGPTSystem(RepositoryContinuationSystem):
    repo = "0nutation/SpeechGPT"
    driver = "speechgpt_driver.py"
