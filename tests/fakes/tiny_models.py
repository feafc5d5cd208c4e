"""Tiny models built locally for tests (no hub): random weights, real architectures and file layouts."""

from __future__ import annotations

import json
from pathlib import Path


def build_tiny_whisper(
    folder: Path, with_special_tokens: bool = True, dtype: str = "float32", init_std: float = 0.02
) -> Path:
    """A 1-layer WhisperForConditionalGeneration with a byte-level tokenizer, saved to `folder`.

    `dtype` is the dtype the weights are saved in and the config declares (whisper-large-v3
    declares float16, which transformers then loads by default). `init_std` spreads the random
    weights: at the default 0.02 the tiny model's output hardly depends on its input."""
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
        WhisperTokenizer,
    )
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    folder.mkdir(parents=True, exist_ok=True)
    chars = list(bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(chars)}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    specials = [
        "<|endoftext|>",
        "<|startoftranscript|>",
        "<|en|>",
        "<|es|>",
        "<|zh|>",
        "<|translate|>",
        "<|transcribe|>",
        "<|startoflm|>",
        "<|startofprev|>",
        "<|nocaptions|>",
        "<|notimestamps|>",
    ]
    tok = WhisperTokenizer(
        str(folder / "vocab.json"),
        str(folder / "merges.txt"),
        unk_token="<|endoftext|>",
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    if with_special_tokens:
        tok.add_special_tokens({"additional_special_tokens": specials[1:]})
    else:  # the incomplete tokenizer a mistaken offline hub load leaves behind
        WhisperProcessor(WhisperFeatureExtractor(feature_size=80), tok).save_pretrained(folder)
        (folder / "config.json").write_text(json.dumps({"model_type": "whisper"}))
        return folder
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    n = len(tok)
    cfg = WhisperConfig(
        vocab_size=n,
        num_mel_bins=80,
        encoder_layers=1,
        encoder_attention_heads=2,
        decoder_layers=1,
        decoder_attention_heads=2,
        d_model=16,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_source_positions=1500,
        max_target_positions=64,
        pad_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|endoftext|>"],
        decoder_start_token_id=ids["<|startoftranscript|>"],
        begin_suppress_tokens=None,
        suppress_tokens=None,
        init_std=init_std,
    )
    import torch

    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(cfg).to(getattr(torch, dtype))
    gen = GenerationConfig(
        decoder_start_token_id=ids["<|startoftranscript|>"],
        eos_token_id=ids["<|endoftext|>"],
        pad_token_id=ids["<|endoftext|>"],
        bos_token_id=ids["<|endoftext|>"],
        no_timestamps_token_id=ids["<|notimestamps|>"],
        is_multilingual=True,
        lang_to_id={"<|en|>": ids["<|en|>"], "<|es|>": ids["<|es|>"], "<|zh|>": ids["<|zh|>"]},
        task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
        max_length=64,
        forced_decoder_ids=None,
        begin_suppress_tokens=None,
        suppress_tokens=None,
    )
    model.generation_config = gen
    model.save_pretrained(folder)
    WhisperProcessor(WhisperFeatureExtractor(feature_size=80), tok).save_pretrained(folder)
    return folder


def build_tiny_llama(folder: Path, words: list[str], chat_template: bool = True, max_positions: int = 2048) -> Path:
    """A randomly initialised 1-layer Llama with a word-level tokenizer over `words`
    (the first three must be <pad>, <eos>, <unk>) and a minimal chat template, saved to folder."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    assert words[:3] == ["<pad>", "<eos>", "<unk>"], words[:3]
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    if chat_template:
        tok.chat_template = (
            "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}assistant : {% endif %}"
        )
    torch.manual_seed(0)
    lm = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(words),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=max_positions,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=1,
        )
    )
    lm.save_pretrained(folder)
    tok.save_pretrained(folder)
    return Path(folder)
