"""SpeechGPT driver (0nutation/SpeechGPT): continue an audio prompt with the repository's inference class.

Uses speechgpt/src/infer/cli_infer.py's SpeechGPTInference, constructed once: it turns each prompt's
audio into mHuBERT units, generates, and renders the answer's units with the unit vocoder (16 kHz);
the answer's text, when the model writes one, is read from <output_dir>/responses.json. `weights`
is one folder holding the model, the chat LoRA, speech2unit/ and vocoder/. The class sets its own
generation settings, so the continuation length is the model's, not `continuation_s`.

The weights layout and the settings: docs/repository-systems.md, "SpeechGPT".
"""

import json
import os
import sys
import tempfile

from _protocol import revision, serve, to_numpy, write_wav

OUTPUT_RATE = 16000
VARIANTS = ("SpeechGPT-7B-cm", "SpeechGPT-7B-com")


def load(config):
    import speechgpt.src.infer.cli_infer as cli_infer

    # the module tests sys.platform without importing sys
    cli_infer.sys = getattr(cli_infer, "sys", sys)
    root, s = config["weights"], config["settings"]
    variant = s.get("variant") or "SpeechGPT-7B-cm"
    if variant not in VARIANTS:
        raise ValueError(f"unknown SpeechGPT variant {variant!r}; expected one of {VARIANTS}")
    out_dir = tempfile.mkdtemp(prefix="speechgpt-")
    model = cli_infer.SpeechGPTInference(
        model_name_or_path=os.path.join(root, "SpeechGPT-7B-cm"),
        lora_weights=os.path.join(root, "SpeechGPT-7B-com") if variant == "SpeechGPT-7B-com" else None,
        s2u_dir=os.path.join(root, "speech2unit"),
        vocoder_dir=os.path.join(root, "vocoder"),
        output_dir=out_dir,
    )
    return (model, out_dir), {"revision": f"{variant}@{revision(os.path.join(root, 'SpeechGPT-7B-cm'))}"}


def handle(state, req):
    model, out_dir = state
    question = f"{req['prompt'].strip()} this is input: {req['audio']}" if req.get("prompt") else req["audio"]
    sr, wav = model([question])
    wav = to_numpy(wav)
    if wav.size <= 1:
        raise RuntimeError("the model answered without speech units")
    write_wav(req["out"], wav, sr or OUTPUT_RATE)
    text = None
    path = os.path.join(out_dir, "responses.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            lines = [ln for ln in fh if ln.strip()]
        if lines:
            text = (json.loads(lines[-1]).get("textAnswer") or "").strip() or None
    return {"text": text}


if __name__ == "__main__":
    serve(load, handle)
