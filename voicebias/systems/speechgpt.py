"""SpeechGPT (0nutation/SpeechGPT): speech continuation from the user's checkout, in its own environment.

The repository's inference entry points are scripts (speechgpt/src/infer/cli_infer.py,
a unit vocoder), not an importable API, so this adapter runs the command given in
`systems.<name>.command` once per prompt, e.g. a small wrapper script kept in the
checkout. Placeholders: {audio} (input 16 kHz WAV), {out} (WAV to write), {text_out}
(text file, optional), {seed}, {continuation_s}, {weights}, {checkout}; "python" as
the first word is replaced by the environment's interpreter (`python` param). Its
output speaker is the vocoder's fixed voice; without text the runner transcribes
the continuation (params `asr`).
"""

from voicebias.systems.repository import RepositoryContinuationSystem


class SpeechGPTSystem(RepositoryContinuationSystem):
    repo = "0nutation/SpeechGPT"
    driver = None
