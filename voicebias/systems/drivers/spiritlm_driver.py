"""SpiritLM driver (facebookresearch/spiritlm): continue an audio prompt, base or expressive.

Uses the repository's API: Spiritlm(<variant>) and generate(output_modality=...,
interleaved_inputs=[GenerationInput(content=<wav path>, content_type=SPEECH)],
generation_config=GenerationConfig(...)). With `text_stream: true` the output
modality is ARBITRARY (interleaved speech and text; text parts are joined as the
system's own text), else SPEECH. Output audio is 16 kHz. Weights are found by the
repository itself (its checkpoints/ folder, or SPIRITLM_CHECKPOINTS_DIR set from
`weights`).
"""

import os

from _protocol import revision, serve, to_numpy, write_wav

OUTPUT_RATE = 16000
TOKENS_PER_S = 25  # speech units per second of the HuBERT tokenizer (plus style tokens for expressive)


def load(config):
    if config.get("weights"):
        os.environ.setdefault("SPIRITLM_CHECKPOINTS_DIR", config["weights"])
    from spiritlm.model.spiritlm_model import Spiritlm

    s = config["settings"]
    variant = s.get("variant") or config.get("checkpoint") or "spirit-lm-base-7b"
    model = Spiritlm(variant)
    sampling = {"temperature": 0.9, "top_p": 0.95, "do_sample": True, **(s.get("sampling") or {})}
    return (model, sampling), {"revision": f"{variant}@{revision(config.get('weights'))}", "sampling": sampling}


def handle(state, req):
    import numpy as np
    from spiritlm.model.spiritlm_model import ContentType, GenerationInput, OutputModality
    from transformers import GenerationConfig

    model, sampling = state
    per_s = TOKENS_PER_S * (2 if "expressive" in str(getattr(model, "name", "")) else 1)
    max_new = int(float(req.get("continuation_s") or 6.0) * per_s)
    modality = OutputModality.ARBITRARY if req.get("text_stream") else OutputModality.SPEECH
    outputs = model.generate(output_modality=modality,
                             interleaved_inputs=[GenerationInput(content=req["audio"],
                                                                 content_type=ContentType.SPEECH)],
                             generation_config=GenerationConfig(max_new_tokens=max_new, **sampling))
    speech = [to_numpy(o.content) for o in outputs if o.content_type == ContentType.SPEECH]
    text = " ".join(str(o.content).strip() for o in outputs if o.content_type == ContentType.TEXT).strip()
    if not speech:
        raise RuntimeError("the model continued in text only" + (f": {text[:200]}" if text else ""))
    write_wav(req["out"], np.concatenate(speech), OUTPUT_RATE)
    return {"text": text or None}


if __name__ == "__main__":
    serve(load, handle)
