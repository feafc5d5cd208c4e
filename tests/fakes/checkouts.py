"""Fake repository checkouts: the same importable names as the real repositories, tiny behaviour.

They stand in for a user's checkout at the import boundary, so the shipped drivers
(voicebias/systems/drivers/) and the subprocess machinery run for real. The fake
model answers with a tone and the text "heard <n> samples; prompt: <prompt>", and
misbehaves on purpose for inputs whose prompt says so: "CRASH" kills the process,
"HANG" sleeps, "RAISE" raises.
"""

from __future__ import annotations

from pathlib import Path

KIMI = '''
import os, time
import numpy as np
import soundfile as sf

class KimiAudio:
    def __init__(self, model_path, load_detokenizer=True):
        if not os.path.isdir(model_path):
            raise FileNotFoundError(model_path)
        if os.environ.get("FAKE_KIMI_FAIL_LOAD"):
            raise ImportError("No module named 'flash_attn'")
        print("loading fake Kimi-Audio")  # repository chatter must not break the protocol

    def generate(self, messages, output_type="both", **sampling):
        assert output_type == "both" and sampling["audio_top_k"] == 10
        prompt = [m["content"] for m in messages if m["message_type"] == "text"][0]
        audio, sr = sf.read([m["content"] for m in messages if m["message_type"] == "audio"][0])
        assert sr == 16000
        if "CRASH" in prompt:
            os._exit(3)
        if "HANG" in prompt:
            time.sleep(30)
        if "RAISE" in prompt:
            raise ValueError("input too long for the audio tokenizer")
        t = np.arange(12000) / 24000
        return np.sin(2 * np.pi * 220 * t).astype(np.float32) * 0.3, f"heard {len(audio)} samples; prompt: {prompt}"
'''


def kimi_checkout(folder: Path) -> Path:
    """A checkout exposing kimia_infer.api.kimia.KimiAudio."""
    pkg = folder / "kimia_infer" / "api"
    pkg.mkdir(parents=True)
    (folder / "kimia_infer" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "kimia.py").write_text(KIMI)
    return folder


CONTINUE_SCRIPT = '''
import sys
import numpy as np
import soundfile as sf
audio, out, text_out, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
x, sr = sf.read(audio)
sf.write(out, np.tile(x, int(np.ceil(seconds * sr / len(x))))[: int(seconds * sr)], sr)
if text_out != "-":
    open(text_out, "w").write("and then she went home")
'''


def command_checkout(folder: Path) -> Path:
    """A checkout with an inference script continuing the prompt by repeating it."""
    folder.mkdir(parents=True)
    (folder / "continue.py").write_text(CONTINUE_SCRIPT)
    return folder
