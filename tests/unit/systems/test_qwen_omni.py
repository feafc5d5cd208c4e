"""Qwen2.5-Omni adapter: loading is checked before any call, with one clear message per problem,
and a real (tiny) Qwen2.5-Omni answers a speech request with text and 24 kHz speech.

The generation tests build a randomly initialised Qwen2.5-Omni locally (thinker with
audio encoder and text model, talker, token2wav DiT + BigVGAN; about half a million
parameters, most of them the talker's codec vocabulary, kept at the checkpoint's size
so its control codes keep their ids), with a byte-level tokenizer made with the
`tokenizers` library carrying the model's special tokens, a Whisper feature extractor,
a chat template in the checkpoint's turn format and a speaker table (spk_dict.pt),
laid out like the checkpoint's folder. The image and video processors are never
built: the adapter loads the processor's audio and text parts only (transformers'
video processor needs torchvision, which this environment lacks). Nothing is
mocked: the real transformers classes run on the CPU, in a few seconds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from voicebias.errors import SetupError
from voicebias.systems.catalog import build_system


def test_missing_weights_folder_is_named(tmp_path):
    with pytest.raises(SetupError, match="Qwen2.5-Omni weights expected at .*Qwen2.5-Omni-7B are missing"):
        build_system("qwen_omni", {"device": "cpu"}, root=tmp_path)


def test_a_folder_with_another_model_is_refused(tmp_path):
    folder = tmp_path / "models" / "weights" / "Qwen2.5-Omni-7B"
    folder.mkdir(parents=True)
    with pytest.raises(SetupError, match="no config.json"):
        build_system("qwen_omni", {"device": "cpu"}, root=tmp_path)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_audio"}))
    with pytest.raises(SetupError, match="'qwen2_audio' model, not Qwen2.5-Omni"):
        build_system("qwen_omni", {"device": "cpu"}, root=tmp_path)


def test_gpu_requirement_and_lazy_loading(tmp_path):
    import torch

    folder = tmp_path / "models" / "weights" / "Qwen2.5-Omni-7B"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2_5_omni"}))
    if not torch.cuda.is_available():
        with pytest.raises(SetupError, match="needs a CUDA GPU"):
            build_system("qwen_omni", {}, root=tmp_path)
    system = build_system("qwen_omni", {"device": "cpu", "speaker": "Ethan"}, root=tmp_path)
    assert system._model is None and system.speaker == "Ethan"  # nothing loaded until a call needs it
    assert system.revision.startswith("Qwen2.5-Omni-7B@config-")
    # the first real call loads the folder, and an incomplete folder is a setup error (the stage stops)
    from tests.fakes.stimuli import make_stimuli
    from voicebias.systems.base import S2SRequest

    s = make_stimuli(tmp_path, 1).iloc[0]
    with pytest.raises(SetupError, match="cannot be loaded"):
        system.respond(S2SRequest(s.stimulus_id, "en", "en", "describe", "p", str(tmp_path / s.path), s.sha256, 1))


# ---------------------------------------------------------------------------
# generation on a tiny Qwen2.5-Omni built here

#: one chat turn per message in the checkpoint's format; audio parts become the audio placeholder
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'audio' %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: named placeholders the processor reads from the tokenizer
NAMED_TOKENS = {
    "audio_token": "<|AUDIO|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
}
OTHER_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|tts_text_pad|>",
    "<|tts_text_bos|>",
    "<|tts_text_eos|>",
    "<|tts_text_bos_single|>",
]
CODEBOOK = 8192  # speech codes the talker may emit (its vocabulary adds control codes above)
DIT_POSITIONS = 64  # mel frames the tiny DiT accepts: 2 per speech code, so at most 32 codes


def build_tiny_qwen_omni(folder: Path) -> Path:
    """A randomly initialised Qwen2.5-Omni with its tokenizer, feature extractor and speakers, saved to `folder`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2_5OmniConfig,
        Qwen2_5OmniForConditionalGeneration,
        Qwen2VLImageProcessorPil,
        WhisperFeatureExtractor,
    )
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    folder.mkdir(parents=True, exist_ok=True)
    # tokenizer: one token per byte, then the special tokens
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    for t in OTHER_TOKENS + list(NAMED_TOKENS.values()):
        vocab[t] = len(vocab)
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>", extra_special_tokens=dict(NAMED_TOKENS)
    )
    tok.add_special_tokens(
        {"additional_special_tokens": OTHER_TOKENS + list(NAMED_TOKENS.values())}, replace_extra_special_tokens=False
    )
    tok.save_pretrained(folder)
    ids = {t: tok.convert_tokens_to_ids(t) for t in OTHER_TOKENS + list(NAMED_TOKENS.values())}
    # the checkpoint keeps the feature extractor's and the image processor's settings in one
    # preprocessor_config.json, and its chat template beside it
    features = {
        **json.loads(Qwen2VLImageProcessorPil().to_json_string()),
        **json.loads(WhisperFeatureExtractor(feature_size=128).to_json_string()),
        "processor_class": "Qwen2_5OmniProcessor",
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(features, indent=2))
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))

    width = 32  # thinker width, also what the talker reads
    placeholders = dict(
        audio_token_index=ids["<|AUDIO|>"],
        image_token_index=ids["<|IMAGE|>"],
        video_token_index=ids["<|VIDEO|>"],
        audio_start_token_id=ids["<|audio_bos|>"],
        audio_end_token_id=ids["<|audio_eos|>"],
        vision_start_token_id=ids["<|vision_bos|>"],
        vision_end_token_id=ids["<|vision_eos|>"],
    )
    thinker = dict(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=width,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=1024,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]},
            pad_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
        ),
        audio_config=dict(
            num_mel_bins=128,
            encoder_layers=1,
            encoder_attention_heads=2,
            encoder_ffn_dim=32,
            d_model=16,
            output_dim=width,
        ),
        vision_config=dict(
            depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=width, fullatt_block_indexes=[0]
        ),
        **placeholders,
    )
    talker = dict(
        vocab_size=CODEBOOK + 256,
        embedding_size=width,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [1, 1, 2]},
        tts_text_start_token_id=ids["<|tts_text_bos|>"],
        tts_text_end_token_id=ids["<|tts_text_eos|>"],
        tts_text_pad_token_id=ids["<|tts_text_pad|>"],
        **placeholders,
    )
    dit = dict(
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        head_dim=8,
        emb_dim=8,
        num_embeds=CODEBOOK,
        mel_dim=16,
        enc_emb_dim=8,
        enc_dim=8,
        enc_channels=[8, 8, 8],
        enc_kernel_sizes=[3, 3, 1],
        enc_dilations=[1, 1, 1],
        enc_attention_channels=4,
        enc_se_channels=4,
        look_ahead_layers=[0],
        look_backward_layers=[0],
        max_position_embeddings=DIT_POSITIONS,
        dropout=0.0,
    )
    # 240 output samples per mel frame (8 * 6 * 5), as the checkpoint's vocoder: 24 kHz speech
    bigvgan = dict(
        mel_dim=16,
        upsample_initial_channel=16,
        resblock_kernel_sizes=[3],
        resblock_dilation_sizes=[[1, 1, 1]],
        upsample_rates=[8, 6, 5],
        upsample_kernel_sizes=[16, 12, 10],
    )
    config = Qwen2_5OmniConfig(
        thinker_config=thinker, talker_config=talker, token2wav_config=dict(dit_config=dit, bigvgan_config=bigvgan)
    )
    torch.manual_seed(0)
    model = Qwen2_5OmniForConditionalGeneration(config)
    with torch.no_grad():
        # random heads, restricted so that the output is usable: the thinker writes lowercase letters (a
        # readable transcript, never an early end), the talker writes speech codes (never an early end),
        # and the vocoder's last layer is scaled up so its speech survives 16-bit files (random: ~1e-5)
        letters = [tok.convert_tokens_to_ids(c) for c in "abcdefghijklmnopqrstuvwxyz"]
        keep = torch.zeros(len(tok), dtype=torch.bool)
        keep[letters] = True
        model.thinker.lm_head.weight[~keep] = 0.0
        model.talker.codec_head.weight[CODEBOOK:] = 0.0
        model.token2wav.code2wav_bigvgan_model.conv_post.weight.mul_(1e4)
    model.save_pretrained(folder)
    # built-in voice: text start token, speaker embedding and reference mel of the token2wav
    torch.save(
        {
            "Chelsie": {
                "bos_token": ids["<|tts_text_bos_single|>"],
                "cond": torch.randn(1, 8),
                "ref_mel": torch.randn(1, 40, 16),
            }
        },
        folder / "spk_dict.pt",
    )
    return folder


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    return build_tiny_qwen_omni(tmp_path_factory.mktemp("qwen") / "Qwen2.5-Omni-tiny")


def qwen_params(folder: Path, **extra):
    return {"weights": str(folder), "device": "cpu", "thinker_max_new_tokens": 4, "talker_max_new_tokens": 8, **extra}


def test_tiny_model_answers_with_text_and_24khz_speech(tiny_qwen, tmp_path):
    import soundfile as sf

    from tests.fakes.stimuli import make_stimuli
    from voicebias.systems.base import S2SRequest
    from voicebias.systems.runner import ResponseCache, run_task, validate_responses
    from voicebias.tasks import load_tasks

    stimuli = make_stimuli(tmp_path, 1)  # 0.25 s tone at 16 kHz
    system = build_system("qwen_omni", qwen_params(tiny_qwen), root=tmp_path)
    table, counts = run_task(
        system,
        load_tasks()["describe"],
        stimuli,
        tmp_path / "out",
        ResponseCache(tmp_path / "c"),
        seed=7,
        root=tmp_path,
        progress=False,
    )
    row = table.iloc[0]
    assert counts["calls"] == 1 and counts["failed"] == 0
    assert row.status == "ok" and row.error == ""
    assert isinstance(row.transcript, str) and row.transcript.strip() and row.transcript_source == "system"
    out = tmp_path / row.output_audio
    assert sf.info(str(out)).samplerate == 24000
    wave, sr = sf.read(str(out), dtype="float32")
    assert sr == 24000 and wave.ndim == 1 and len(wave) > 0 and np.isfinite(wave).all() and np.abs(wave).max() > 0
    assert row.output_duration_s == pytest.approx(len(wave) / 24000, abs=1e-3)
    prov = json.loads(row.provenance)
    assert prov == {"model_revision": system.revision, "speaker": "Chelsie", "device": "cpu"}
    assert row.model_revision == system.revision and system.revision.startswith("Qwen2.5-Omni-tiny@config-")
    validate_responses(table)

    # the adapter's own response: 24 kHz float samples, and the same seed gives the same answer
    s = stimuli.iloc[0]
    request = S2SRequest(s.stimulus_id, "en", "en", "describe", row.prompt, str(tmp_path / s.path), s.sha256, 7)
    first, again = system.respond(request), system.respond(request)
    assert first.status == "ok" and first.sample_rate == 24000 and first.audio.dtype == np.float32
    assert first.audio.size > 0 and np.isfinite(first.audio).all()
    assert first.transcript == row.transcript
    assert again.transcript == first.transcript and np.array_equal(again.audio, first.audio)


def test_a_generation_that_raises_is_recorded_as_failed(tiny_qwen, tmp_path):
    from tests.fakes.stimuli import make_stimuli
    from voicebias.systems.runner import ResponseCache, build_requests, cache_key, run_task
    from voicebias.tasks import load_tasks

    # 40 speech codes need 80 mel frames, more than the tiny DiT's 64: token2wav raises inside generate
    stimuli = make_stimuli(tmp_path, 1)
    system = build_system("qwen_omni", qwen_params(tiny_qwen, talker_max_new_tokens=40), root=tmp_path)
    cache = ResponseCache(tmp_path / "c")
    table, counts = run_task(
        system, load_tasks()["describe"], stimuli, tmp_path / "out", cache, seed=7, root=tmp_path, progress=False
    )
    row = table.iloc[0]
    assert counts["failed"] == 1 and row.status == "failed"
    assert row.error.startswith("ValueError: ") and "max_position_embeddings" in row.error
    assert row.output_audio is None and row.output_duration_s is None and row.transcript is None
    assert not list((tmp_path / "out" / "audio").iterdir())  # no output file stands in for the failed answer
    # nothing cached: the next run calls the model again
    _, requests = build_requests(system, load_tasks()["describe"], stimuli, 7, tmp_path)
    assert cache.get(cache_key(system, requests[0])) is None


def test_sampling_settings_reach_the_model(tiny_qwen, tmp_path):
    from tests.fakes.stimuli import make_stimuli
    from voicebias.systems.base import S2SRequest

    s = make_stimuli(tmp_path, 1).iloc[0]
    request = S2SRequest(s.stimulus_id, "en", "en", "describe", "p", str(tmp_path / s.path), s.sha256, 3)
    sampled = build_system("qwen_omni", qwen_params(tiny_qwen, temperature=0.7, talker_do_sample=False), root=tmp_path)
    assert sampled.generate_kwargs() == {
        "speaker": "Chelsie",
        "generation_mode": "audio",
        "use_audio_in_video": False,
        "thinker_max_new_tokens": 4,
        "thinker_do_sample": True,
        "thinker_temperature": 0.7,
        "talker_do_sample": False,
        "talker_max_new_tokens": 8,
    }
    first, again = sampled.respond(request), sampled.respond(request)
    assert first.status == again.status == "ok" and first.transcript == again.transcript  # seeded sampling
    assert np.array_equal(first.audio, again.audio)
    greedy = build_system("qwen_omni", qwen_params(tiny_qwen, temperature=0), root=tmp_path)
    kwargs = greedy.generate_kwargs()
    assert kwargs["thinker_do_sample"] is False and "thinker_temperature" not in kwargs
    assert greedy.respond(request).status == "ok"


def test_a_speaker_the_checkpoint_lacks_stops_the_stage(tiny_qwen, tmp_path):
    from tests.fakes.stimuli import make_stimuli
    from voicebias.systems.base import S2SRequest

    s = make_stimuli(tmp_path, 1).iloc[0]
    system = build_system("qwen_omni", qwen_params(tiny_qwen, speaker="Ethan"), root=tmp_path)
    with pytest.raises(SetupError, match="speaker 'Ethan' is not among the checkpoint's built-in voices \\(Chelsie\\)"):
        system.respond(S2SRequest(s.stimulus_id, "en", "en", "describe", "p", str(tmp_path / s.path), s.sha256, 1))
