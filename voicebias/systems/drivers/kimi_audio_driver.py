"""Kimi-Audio-7B-Instruct driver (MoonshotAI/Kimi-Audio): audio + instruction -> 24 kHz speech and text.

Uses the repository's documented API: KimiAudio(model_path=..., load_detokenizer=True)
and generate(messages, output_type="both", **sampling) -> (waveform, text). The task
prompt is sent as a text message before the audio, as in the repository's examples.
"""

from _protocol import revision, serve, write_wav

SAMPLING = {"audio_temperature": 0.8, "audio_top_k": 10, "text_temperature": 0.0, "text_top_k": 5,
            "audio_repetition_penalty": 1.0, "audio_repetition_window_size": 64,
            "text_repetition_penalty": 1.0, "text_repetition_window_size": 16}
OUTPUT_RATE = 24000


def load(config):
    from kimia_infer.api.kimia import KimiAudio

    model = KimiAudio(model_path=config["weights"], load_detokenizer=True)
    sampling = {**SAMPLING, **(config["settings"].get("sampling") or {})}
    return (model, sampling), {"revision": revision(config["weights"]), "sampling": sampling}


def handle(state, req):
    model, sampling = state
    messages = [{"role": "user", "message_type": "text", "content": req["prompt"]},
                {"role": "user", "message_type": "audio", "content": req["audio"]}]
    wav, text = model.generate(messages, **sampling, output_type="both")
    write_wav(req["out"], wav, OUTPUT_RATE)
    return {"text": text}


if __name__ == "__main__":
    serve(load, handle)
