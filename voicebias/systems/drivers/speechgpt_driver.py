"""SpeechGPT driver (0nutation/SpeechGPT): continue an audio prompt with the repository's inference class.

Uses speechgpt/src/infer/cli_infer.py's SpeechGPTInference(model_name_or_path,
lora_weights, s2u_dir, vocoder_dir, output_dir): called on a list of prompts it turns
each audio path into mHuBERT units, wraps them in its chat template, generates, and
renders the answer's units with the unit vocoder, returning (16000, waveform). The
answer's text, when the model writes one, is the last line of
<output_dir>/responses.json ("textAnswer").

`weights` is one folder holding SpeechGPT-7B-cm/ (the model), SpeechGPT-7B-com/
(the chat LoRA, used when `variant` is SpeechGPT-7B-com), speech2unit/ (the mHuBERT
checkpoint and its k-means) and vocoder/ (vocoder.pt and config.json), the files
the repository's README downloads. The class sets its own generation settings
(max_new_tokens 2048, temperature 0.7, top_p 0.8, top_k 50), so the continuation
length is the model's, not `continuation_s`.
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
