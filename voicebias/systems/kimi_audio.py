"""Kimi-Audio-7B-Instruct (MoonshotAI/Kimi-Audio) from the user's checkout, in its own environment.

Driver: drivers/kimi_audio_driver.py (KimiAudio(...).generate(messages, output_type="both")).
Output: 24 kHz speech in the detokenizer's fixed timbre, plus the model's own text.
Params: `python` (interpreter of the checkout's environment), optional `checkout`,
`weights` (else the card's `requires`), `sampling` (the repository's sampling keys),
`timeout_s`, `startup_timeout_s`, `device`.
"""

from voicebias.systems.repository import RepositoryS2SSystem


class KimiAudioSystem(RepositoryS2SSystem):
    repo = "MoonshotAI/Kimi-Audio"
    driver = "kimi_audio_driver.py"
