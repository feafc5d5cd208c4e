"""Tiny models built locally for tests (no hub): random weights, real architectures and file layouts."""

from __future__ import annotations

import json
from pathlib import Path


def build_tiny_whisper(folder: Path, with_special_tokens: bool = True) -> Path:
    """A 1-layer WhisperForConditionalGeneration with a byte-level tokenizer, saved to `folder`."""
    from transformers import (WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration,
                              WhisperProcessor, WhisperTokenizer, GenerationConfig)
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    folder.mkdir(parents=True, exist_ok=True)
    chars = list(bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(chars)}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    specials = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|es|>", "<|zh|>", "<|translate|>",
                "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
    tok = WhisperTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), unk_token="<|endoftext|>",
                           bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    if with_special_tokens:
        tok.add_special_tokens({"additional_special_tokens": specials[1:]})
    else:  # the incomplete tokenizer a mistaken offline hub load leaves behind
        WhisperProcessor(WhisperFeatureExtractor(feature_size=80), tok).save_pretrained(folder)
        (folder / "config.json").write_text(json.dumps({"model_type": "whisper"}))
        return folder
    ids = {t: tok.convert_tokens_to_ids(t) for t in specials}
    n = len(tok)
    cfg = WhisperConfig(vocab_size=n, num_mel_bins=80, encoder_layers=1, encoder_attention_heads=2, decoder_layers=1,
                        decoder_attention_heads=2, d_model=16, encoder_ffn_dim=32, decoder_ffn_dim=32,
                        max_source_positions=1500, max_target_positions=64, pad_token_id=ids["<|endoftext|>"],
                        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|endoftext|>"],
                        decoder_start_token_id=ids["<|startoftranscript|>"], begin_suppress_tokens=None,
                        suppress_tokens=None)
    import torch
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(cfg)
    gen = GenerationConfig(decoder_start_token_id=ids["<|startoftranscript|>"], eos_token_id=ids["<|endoftext|>"],
                           pad_token_id=ids["<|endoftext|>"], bos_token_id=ids["<|endoftext|>"],
                           no_timestamps_token_id=ids["<|notimestamps|>"], is_multilingual=True,
                           lang_to_id={"<|en|>": ids["<|en|>"], "<|es|>": ids["<|es|>"], "<|zh|>": ids["<|zh|>"]},
                           task_to_id={"transcribe": ids["<|transcribe|>"], "translate": ids["<|translate|>"]},
                           max_length=64, forced_decoder_ids=None, begin_suppress_tokens=None, suppress_tokens=None)
    model.generation_config = gen
    model.save_pretrained(folder)
    WhisperProcessor(WhisperFeatureExtractor(feature_size=80), tok).save_pretrained(folder)
    return folder
