"""Whisper ASR (transformers) for systems whose output has no text stream.

Loads a Whisper checkpoint from a local folder only (no hub at run time), and fails
fast with a clear message when the folder is missing or incomplete. The tokenizer
is checked explicitly: with HF_HUB_OFFLINE=1 a hub name yields an EMPTY
WhisperTokenizer without any error (REFERENCES.md), which would silently turn every
transcript into an empty string.

Transcripts are cached by the runner per (system call, ASR configuration), so a new
ASR model never repeats a system call.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np

from voicebias.audio import resample
from voicebias.systems.base import SetupError

SAMPLE_RATE = 16000  # Hz, Whisper's input rate
REQUIRED_TOKENS = ("<|startoftranscript|>", "<|transcribe|>", "<|notimestamps|>")


class ASRSetupError(SetupError):
    """The ASR model cannot be loaded from the folder given; the message says why."""


class WhisperASR:
    """Transcribe mono audio with a local Whisper checkout (WhisperForConditionalGeneration).

    Parameters
    ----------
    model_dir : folder with config.json, the weights, the tokenizer and preprocessor files
        (as saved by ``save_pretrained`` or downloaded from the hub beforehand).
    device : 'cpu' or 'cuda'.
    max_new_tokens : cap on generated tokens per clip.
    beams : beam width (1 = greedy, deterministic).
    """

    def __init__(self, model_dir: str | Path, device: str = "cpu", max_new_tokens: int = 200, beams: int = 1):
        self.model_dir = Path(model_dir)
        if not self.model_dir.is_dir():
            raise ASRSetupError(f"Whisper model folder {self.model_dir} not found. Download a Whisper checkpoint "
                                "(e.g. openai/whisper-large-v3) into that folder; it is never fetched at run time")
        config = self.model_dir / "config.json"
        if not config.exists():
            raise ASRSetupError(f"{self.model_dir} holds no config.json: not a saved transformers model")
        model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
        if model_type != "whisper":
            raise ASRSetupError(f"{self.model_dir} holds a '{model_type}' model, not Whisper")
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        try:
            self.processor = WhisperProcessor.from_pretrained(str(self.model_dir), local_files_only=True)
        except (OSError, ValueError, TypeError) as exc:
            raise ASRSetupError(f"the Whisper tokenizer/feature extractor in {self.model_dir} cannot be loaded: "
                                f"{exc}") from None
        tok = self.processor.tokenizer
        vocab = tok.get_vocab()
        missing = [t for t in REQUIRED_TOKENS if t not in vocab]
        if len(vocab) == 0 or missing:
            raise ASRSetupError(f"the Whisper tokenizer in {self.model_dir} is empty or incomplete (missing "
                                f"{missing or 'every token'}): copy vocab.json, merges.txt, added_tokens.json and "
                                "special_tokens_map.json from the checkpoint")
        try:
            self.model = WhisperForConditionalGeneration.from_pretrained(str(self.model_dir),
                                                                         local_files_only=True).to(device).eval()
        except OSError as exc:
            raise ASRSetupError(f"the Whisper weights in {self.model_dir} cannot be loaded: {exc}") from None
        self.device = device
        self.max_new_tokens = int(max_new_tokens)
        self.beams = int(beams)
        self.name = self.model_dir.name
        weights = sorted(self.model_dir.glob("*.safetensors")) or sorted(self.model_dir.glob("*.bin"))
        h = hashlib.sha256(config.read_bytes())
        for w in weights:
            h.update(f"{w.name}:{w.stat().st_size}:{int(w.stat().st_mtime)}".encode())
        h.update(f"{self.max_new_tokens}:{self.beams}".encode())
        #: names this ASR configuration in the transcript cache
        self.cache_id = f"{self.name}-{h.hexdigest()[:12]}"
        self._lock = threading.Lock()

    def transcribe(self, audio: np.ndarray, sample_rate: int, language: str | None = None) -> str:
        """Text of one clip (mono float samples at `sample_rate` Hz); `language` forces the decoding language."""
        import torch

        x = resample(np.asarray(audio, dtype=np.float32), int(sample_rate), SAMPLE_RATE)
        feats = self.processor(x, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        # the model runs in the dtype its config declares (float16 for whisper-large-v3)
        feats = feats.to(device=self.model.device, dtype=self.model.dtype)
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "num_beams": self.beams, "do_sample": False}
        if language:
            kwargs.update(language=language, task="transcribe")
        with self._lock, torch.no_grad():  # one model, shared by the runner's threads
            ids = self.model.generate(feats, **kwargs)
        return self.processor.batch_decode(ids, skip_special_tokens=True)[0].strip()
