"""Step-Audio-2-mini driver (stepfun-ai/Step-Audio2): speech in, speech and text out.

Uses the repository's API: StepAudio2(model_path) called on chat messages (system
prompt, a human turn holding the audio, an assistant turn opened with <tts_start>)
returns (tokens, text, audio_tokens); Token2wav(<weights>/token2wav) renders audio
tokens below 6561 with the voice of a prompt wav (the card's fixed output voice).

Sampling defaults are those of the repository's speech-to-speech example
(stepaudio2.py): max_new_tokens 4096, temperature 0.7, top_p 0.9, repetition
penalty 1.05, sampling on; a spoken answer needs far more tokens than a text one.
The prompt wav is the system's `voice` (a path relative to the checkout), default
assets/default_female.wav.
"""

import os

from _protocol import revision, serve

AUDIO_VOCAB = 6561


def load(config):
    from stepaudio2 import StepAudio2
    from token2wav import Token2wav

    s = config["settings"]
    model = StepAudio2(config["weights"])
    t2w = Token2wav(os.path.join(config["weights"], "token2wav"))
    prompt_wav = s.get("voice") or s.get("prompt_wav") or "assets/default_female.wav"
    sampling = {
        "max_new_tokens": 4096,
        "temperature": 0.7,
        "top_p": 0.9,
        "repetition_penalty": 1.05,
        "do_sample": True,
        **{k: s[k] for k in ("temperature", "top_p", "max_new_tokens") if s.get(k) is not None},
        **(s.get("sampling") or {}),
    }
    return (model, t2w, prompt_wav, sampling), {
        "revision": revision(config["weights"]),
        "prompt_wav": prompt_wav,
        "sampling": sampling,
    }


def handle(state, req):
    model, t2w, prompt_wav, sampling = state
    messages = [
        {"role": "system", "content": req["prompt"]},
        {"role": "human", "content": [{"type": "audio", "audio": req["audio"]}]},
        {"role": "assistant", "content": "<tts_start>", "eot": False},
    ]
    _, text, audio_tokens = model(messages, **sampling)
    audio_tokens = [t for t in (audio_tokens or []) if t < AUDIO_VOCAB]
    if not audio_tokens:
        raise RuntimeError("the model produced no audio tokens")
    with open(req["out"], "wb") as fh:
        fh.write(t2w(audio_tokens, prompt_wav=prompt_wav))
    return {"text": text}


if __name__ == "__main__":
    serve(load, handle)
