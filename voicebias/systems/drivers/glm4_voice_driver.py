"""GLM-4-Voice-9B driver (THUDM/GLM-4-Voice): speech tokenizer + 9B model + flow/HiFT decoder.

Follows the repository's demo pipeline: WhisperVQ speech tokens of the input
(speech_tokenizer.utils.extract_speech_token), a chat prompt whose system turn holds
the task prompt and the model's interleaving instruction, generation of interleaved
text and audio tokens (audio tokens are those from <|audio_0|> on), and
flow_inference.AudioDecoder.token2wav for 22.05 kHz audio. Weights: `weights` is the
folder holding glm-4-voice-9b, glm-4-voice-tokenizer and glm-4-voice-decoder.

The decoder's flow model comes from the checkout's cosyvoice folder and imports
`matcha` from the third_party/Matcha-TTS git submodule; like the repository's
web_demo.py, both folders are put first on sys.path before the decoder is built.
"""

import os
import sys
import uuid

from _protocol import revision, serve, write_wav

#: The repository's system prompt for speech input (web_demo.py), verbatim.
INTERLEAVE = (
    "User will provide you with a speech instruction. Do it step by step. First, think about the "
    "instruction and respond in a interleaved manner, with 13 text token followed by 26 audio tokens. "
)
OUTPUT_RATE = 22050
#: Repository folders the decoder imports from, in the order they end up on sys.path.
IMPORT_PATHS = (os.path.join("third_party", "Matcha-TTS"), "cosyvoice")


def add_import_paths(checkout):
    """Put the Matcha-TTS submodule and cosyvoice first on sys.path; a missing submodule is named."""
    matcha = os.path.join(checkout, "third_party", "Matcha-TTS")
    if not os.path.isdir(os.path.join(matcha, "matcha")):
        raise RuntimeError(
            f"{matcha} is empty: the GLM-4-Voice checkout lacks its Matcha-TTS git submodule. "
            f"Run `git submodule update --init` in {checkout} (or clone with --recurse-submodules)"
        )
    for rel in reversed(IMPORT_PATHS):
        path = os.path.join(checkout, rel)
        if path not in sys.path:
            sys.path.insert(0, path)


def load(config):
    add_import_paths(config.get("checkout") or os.getcwd())  # before flow_inference, as web_demo.py does
    import torch
    from flow_inference import AudioDecoder
    from speech_tokenizer.modeling_whisper import WhisperVQEncoder
    from transformers import AutoModel, AutoTokenizer, WhisperFeatureExtractor

    root, s = config["weights"], config["settings"]
    device = config.get("device", "cuda")
    model_dir = os.path.join(root, "glm-4-voice-9b")
    tok_dir = os.path.join(root, "glm-4-voice-tokenizer")
    dec_dir = os.path.join(root, "glm-4-voice-decoder")
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    model = AutoModel.from_pretrained(model_dir, trust_remote_code=True, torch_dtype=torch.bfloat16).to(device).eval()
    whisper = WhisperVQEncoder.from_pretrained(tok_dir).eval().to(device)
    features = WhisperFeatureExtractor.from_pretrained(tok_dir)
    decoder = AudioDecoder(
        config_path=os.path.join(dec_dir, "config.yaml"),
        flow_ckpt_path=os.path.join(dec_dir, "flow.pt"),
        hift_ckpt_path=os.path.join(dec_dir, "hift.pt"),
        device=device,
    )
    # the web demo's defaults; the system's temperature, top_p and max_new_tokens override them
    sampling = {
        "temperature": 0.2,
        "top_p": 0.8,
        "max_new_tokens": 2000,
        **{k: s[k] for k in ("temperature", "top_p", "max_new_tokens") if s.get(k) is not None},
        **(s.get("sampling") or {}),
    }
    state = (tokenizer, model, whisper, features, decoder, sampling, device)
    return state, {"revision": revision(model_dir), "sampling": sampling}


def handle(state, req):
    import torch
    from speech_tokenizer.utils import extract_speech_token

    tokenizer, model, whisper, features, decoder, sampling, device = state
    tokens = extract_speech_token(whisper, features, [req["audio"]])[0]
    audio_in = "<|begin_of_audio|>" + "".join(f"<|audio_{t}|>" for t in tokens) + "<|end_of_audio|>"
    prompt = f"<|system|>\n{req['prompt']}\n{INTERLEAVE}<|user|>\n{audio_in}<|assistant|>streaming_transcription\n"
    ids = tokenizer([prompt], return_tensors="pt").to(device)
    with torch.no_grad():
        out = model.generate(
            **ids,
            do_sample=True,
            temperature=sampling["temperature"],
            top_p=sampling["top_p"],
            max_new_tokens=sampling["max_new_tokens"],
        )
    new = out[0, ids["input_ids"].shape[1] :].tolist()
    audio_offset = tokenizer.convert_tokens_to_ids("<|audio_0|>")
    end_id = tokenizer.convert_tokens_to_ids("<|user|>")
    text_ids, audio_ids = [], []
    for t in new:
        if t == end_id:
            break
        (audio_ids if t >= audio_offset else text_ids).append(t - audio_offset if t >= audio_offset else t)
    if not audio_ids:
        raise RuntimeError("the model produced no audio tokens")
    tts = torch.tensor(audio_ids, device=device).unsqueeze(0)
    wav, _ = decoder.token2wav(
        tts,
        uuid=str(uuid.uuid4()),
        prompt_token=torch.zeros(1, 0, dtype=torch.int64).to(device),
        prompt_feat=torch.zeros(1, 0, 80).to(device),
        finalize=True,
    )
    write_wav(req["out"], wav, OUTPUT_RATE)
    return {"text": tokenizer.decode(text_ids, skip_special_tokens=False).strip()}


if __name__ == "__main__":
    serve(load, handle)
