"""SpiritLM base and expressive (facebookresearch/spiritlm): speech continuation from the user's
checkout, in its own environment (weights by request form; noncommercial licence).

Driver: drivers/spiritlm_driver.py. `variant` (spirit-lm-base-7b or spirit-lm-expressive-7b)
selects the model and is part of the cache key; `text_stream: true` asks for
interleaved speech and text (the text becomes the system's own transcript),
otherwise the runner transcribes the continuation with Whisper (params `asr`).
"""

from voicebias.systems.repository import RepositoryContinuationSystem


class SpiritLMSystem(RepositoryContinuationSystem):
    repo = "facebookresearch/spiritlm"
    driver = "spiritlm_driver.py"
