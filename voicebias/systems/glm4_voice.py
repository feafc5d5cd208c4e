"""GLM-4-Voice-9B (THUDM/GLM-4-Voice) from the user's checkout, in its own environment.

Driver: drivers/glm4_voice_driver.py (speech tokenizer -> 9B model -> flow/HiFT decoder).
Output: 22.05 kHz speech in the decoder's fixed timbre, plus the interleaved text.
`weights` names the folder holding glm-4-voice-9b, glm-4-voice-tokenizer and
glm-4-voice-decoder. Other params as for kimi_audio.
"""

from voicebias.systems.repository import RepositoryS2SSystem


class GLM4VoiceSystem(RepositoryS2SSystem):
    repo = "THUDM/GLM-4-Voice"
    driver = "glm4_voice_driver.py"
