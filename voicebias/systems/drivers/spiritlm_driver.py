"""SpiritLM driver (facebookresearch/spiritlm): continue an audio prompt, base or expressive.

Uses the repository's API, Spiritlm(<variant>) and generate(...) on the prompt's audio; with
`text_stream: true` the output interleaves speech and text, else it is speech alone (16 kHz).
Weights are found by the repository itself (its checkpoints/ folder, or SPIRITLM_CHECKPOINTS_DIR
set from `weights`). The token budget is the continuation length times the speech tokenizer's unit
rate, an upper bound on the speech it buys.

The calls, the weights and the unit rates: docs/repository-systems.md, "SpiritLM".
"""

import os

from _protocol import revision, serve, to_numpy, write_wav

OUTPUT_RATE = 16000
HUBERT_PER_S, PITCH_PER_S, STYLE_PER_S = 24.99, 12.5, 1.0  # speech-tokenizer unit rates (units per second)


def tokens_per_second(expressive):
    """Speech tokens per second of audio for the base or the expressive model."""
    return HUBERT_PER_S + (PITCH_PER_S + STYLE_PER_S if expressive else 0.0)


def load(config):
    if config.get("weights"):
        os.environ.setdefault("SPIRITLM_CHECKPOINTS_DIR", config["weights"])
    from spiritlm.model.spiritlm_model import Spiritlm

    s = config["settings"]
    variant = s.get("variant") or config.get("checkpoint") or "spirit-lm-base-7b"
    model = Spiritlm(variant)
    sampling = {
        "temperature": 0.9,
        "top_p": 0.95,
        "do_sample": True,
        **{k: s[k] for k in ("temperature", "top_p") if s.get(k) is not None},
        **(s.get("sampling") or {}),
    }
    return (model, sampling), {"revision": f"{variant}@{revision(config.get('weights'))}", "sampling": sampling}


def handle(state, req):
    import numpy as np
    from spiritlm.model.spiritlm_model import ContentType, GenerationInput, OutputModality
    from transformers import GenerationConfig

    model, sampling = state
    max_new = int(round(float(req.get("continuation_s") or 6.0) * tokens_per_second(model.is_expressive_model)))
    modality = OutputModality.ARBITRARY if req.get("text_stream") else OutputModality.SPEECH
    outputs = model.generate(
        output_modality=modality,
        interleaved_inputs=[GenerationInput(content=req["audio"], content_type=ContentType.SPEECH)],
        generation_config=GenerationConfig(max_new_tokens=max_new, **sampling),
    )
    speech = [to_numpy(o.content) for o in outputs if o.content_type == ContentType.SPEECH]
    text = " ".join(str(o.content).strip() for o in outputs if o.content_type == ContentType.TEXT).strip()
    if not speech:
        raise RuntimeError("the model continued in text only" + (f": {text[:200]}" if text else ""))
    write_wav(req["out"], np.concatenate(speech), OUTPUT_RATE)
    return {"text": text or None}


if __name__ == "__main__":
    serve(load, handle)
