"""Kimi-Audio-7B-Instruct driver (MoonshotAI/Kimi-Audio): audio + instruction -> 24 kHz speech and text.

Uses the repository's documented API: KimiAudio(model_path=..., load_detokenizer=True)
and generate(messages, output_type="both", **sampling) -> (waveform, text). The task
prompt is sent as a text message before the audio, as in the repository's examples.

The repository's prompt manager loads the GLM-4-Voice speech tokenizer by its hub id,
THUDM/glm-4-voice-tokenizer. A folder of that relative name under the working
directory (the checkout) is found before the hub, so the tokenizer must be there
(or in the local Hugging Face cache); the hub is switched off (HF_HUB_OFFLINE=1)
so a missing copy stops the load instead of downloading at run time. The model
folder must also hold whisper-large-v3/.
"""

import os

from _protocol import revision, serve, write_wav

SPEECH_TOKENIZER = "THUDM/glm-4-voice-tokenizer"

SAMPLING = {
    "audio_temperature": 0.8,
    "audio_top_k": 10,
    "text_temperature": 0.0,
    "text_top_k": 5,
    "audio_repetition_penalty": 1.0,
    "audio_repetition_window_size": 64,
    "text_repetition_penalty": 1.0,
    "text_repetition_window_size": 16,
}
OUTPUT_RATE = 24000


def speech_tokenizer_found(checkout):
    """Whether the prompt manager's speech tokenizer loads without the hub."""
    if os.path.isfile(os.path.join(checkout, SPEECH_TOKENIZER, "config.json")):
        return True
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return isinstance(try_to_load_from_cache(SPEECH_TOKENIZER, "config.json"), str)


def load(config):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    checkout = config.get("checkout") or os.getcwd()
    if not speech_tokenizer_found(checkout):
        local = os.path.join(checkout, SPEECH_TOKENIZER)
        raise RuntimeError(
            f"Kimi-Audio loads the speech tokenizer {SPEECH_TOKENIZER} by its hub id, and no local "
            f"copy was found: download it to {local} (e.g. `huggingface-cli download "
            f"{SPEECH_TOKENIZER} --local-dir {local}`)"
        )
    from kimia_infer.api.kimia import KimiAudio

    model = KimiAudio(model_path=config["weights"], load_detokenizer=True)
    sampling = {**SAMPLING, **(config["settings"].get("sampling") or {})}
    return (model, sampling), {"revision": revision(config["weights"]), "sampling": sampling}


def handle(state, req):
    model, sampling = state
    messages = [
        {"role": "user", "message_type": "text", "content": req["prompt"]},
        {"role": "user", "message_type": "audio", "content": req["audio"]},
    ]
    wav, text = model.generate(messages, **sampling, output_type="both")
    write_wav(req["out"], wav, OUTPUT_RATE)
    return {"text": text}


if __name__ == "__main__":
    serve(load, handle)
