"""Step-Audio-2-mini (stepfun-ai/Step-Audio2) from the user's checkout, in its own environment
(the repository pins transformers 4.49).

Driver: drivers/step_audio2_driver.py (StepAudio2 chat call with <tts_start>, Token2wav).
The output voice is set by a prompt wav (`voice`, default the repository's
assets/default_female.wav): keep it fixed across the audit.
"""

from voicebias.systems.repository import RepositoryS2SSystem


class StepAudio2System(RepositoryS2SSystem):
    repo = "stepfun-ai/Step-Audio2"
    driver = "step_audio2_driver.py"
