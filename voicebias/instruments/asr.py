"""Whisper ASR (transformers) for systems whose output has no text stream.

Loads a Whisper checkpoint from a local folder only (no hub at run time) and fails fast when the
folder is missing or incomplete; the tokenizer is checked explicitly, since with HF_HUB_OFFLINE=1
a hub name yields an empty tokenizer without any error. `WhisperASR.transcribe_many` transcribes
in batches of clips decoded in one language, and a clip's tokens do not depend on its batch.
Transcripts are cached by the runner per (system call, ASR configuration).

See docs/instrument.md, "Whisper ASR".
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from voicebias.audio import resample
from voicebias.errors import SetupError

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
    batch_size : clips per `generate` call in `transcribe_many` (default 8 on a GPU, 1 on
        the CPU); not part of `cache_id`, as it does not change the transcripts.
    """

    def __init__(
        self,
        model_dir: str | Path,
        device: str = "cpu",
        max_new_tokens: int = 200,
        beams: int = 1,
        batch_size: int | None = None,
    ):
        self.model_dir = Path(model_dir)
        if not self.model_dir.is_dir():
            raise ASRSetupError(
                f"Whisper model folder {self.model_dir} not found. Download a Whisper checkpoint "
                "(e.g. openai/whisper-large-v3) into that folder; it is never fetched at run time"
            )
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
            raise ASRSetupError(
                f"the Whisper tokenizer/feature extractor in {self.model_dir} cannot be loaded: {exc}"
            ) from None
        tok = self.processor.tokenizer
        vocab = tok.get_vocab()
        missing = [t for t in REQUIRED_TOKENS if t not in vocab]
        if len(vocab) == 0 or missing:
            raise ASRSetupError(
                f"the Whisper tokenizer in {self.model_dir} is empty or incomplete (missing "
                f"{missing or 'every token'}): copy vocab.json, merges.txt, added_tokens.json and "
                "special_tokens_map.json from the checkpoint"
            )
        try:
            self.model = (
                WhisperForConditionalGeneration.from_pretrained(str(self.model_dir), local_files_only=True)
                .to(device)
                .eval()
            )
        except OSError as exc:
            raise ASRSetupError(f"the Whisper weights in {self.model_dir} cannot be loaded: {exc}") from None
        self.device = device
        self.max_new_tokens = int(max_new_tokens)
        self.beams = int(beams)
        self.batch_size = int(batch_size) if batch_size else (8 if str(device).startswith("cuda") else 1)
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
        return self.transcribe_many([audio], sample_rate, [language])[0]

    def transcribe_many(
        self,
        audios: Sequence[np.ndarray],
        sample_rate: int | Sequence[int],
        languages: Sequence[str | None] | None = None,
    ) -> list[str]:
        """Texts of several clips, in input order, decoded `batch_size` at a time.

        `sample_rate`: one rate or one per clip; `languages`: per clip, the forced decoding
        language (None: Whisper's own detection); clips are batched per language.
        """
        ids = self.token_ids(audios, sample_rate, languages)
        return [t.strip() for t in self.processor.batch_decode(ids, skip_special_tokens=True)]

    def token_ids(
        self,
        audios: Sequence[np.ndarray],
        sample_rate: int | Sequence[int],
        languages: Sequence[str | None] | None = None,
        first_logits: bool = False,
    ) -> list[list[int]] | tuple[list[list[int]], np.ndarray]:
        """Generated token ids per clip (decoder prompt included, cut after the end-of-text
        token), in input order; with `first_logits`, also the logits of the first generated
        token, shape (n_clips, vocab), as a check that batching leaves them alone."""
        import torch

        n = len(audios)
        rates = [int(sample_rate)] * n if np.ndim(sample_rate) == 0 else [int(r) for r in sample_rate]  # type: ignore
        langs = list(languages) if languages is not None else [None] * n
        if len(rates) != n or len(langs) != n:
            raise ValueError(f"{n} clips, {len(rates)} sample rates, {len(langs)} languages")
        by_lang: dict[str | None, list[int]] = {}
        for i, lang in enumerate(langs):
            by_lang.setdefault(lang or None, []).append(i)
        out: list[list[int]] = [[] for _ in range(n)]
        logits: list[Any] = [None] * n
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        for lang, ids in by_lang.items():
            for start in range(0, len(ids), self.batch_size):
                part = ids[start : start + self.batch_size]
                clips = [resample(np.asarray(audios[i], dtype=np.float32), rates[i], SAMPLE_RATE) for i in part]
                # each clip padded or cut to 30 s by itself, as when it is alone
                inputs = self.processor(
                    clips, sampling_rate=SAMPLE_RATE, return_tensors="pt", return_attention_mask=True
                )
                # the model runs in the dtype its config declares (float16 for whisper-large-v3)
                feats = inputs.input_features.to(device=self.model.device, dtype=self.model.dtype)
                # the mask (audio frames vs padding) changes nothing in short-form decoding: the
                # encoder ignores it; passed so that generate knows the batch is not unmasked padding
                kwargs: dict[str, Any] = {
                    "max_new_tokens": self.max_new_tokens,
                    "num_beams": self.beams,
                    "do_sample": False,
                    "attention_mask": inputs.attention_mask.to(self.model.device),
                }
                if lang:
                    kwargs.update(language=lang, task="transcribe")
                if first_logits:
                    kwargs.update(return_dict_in_generate=True, output_logits=True)
                with self._lock, torch.no_grad():  # one model, shared by the runner's threads
                    gen = self.model.generate(feats, **kwargs)
                seqs = gen.sequences if first_logits else gen
                for row, i in enumerate(part):
                    toks = [int(t) for t in seqs[row].tolist()]
                    # after the prompt, the first end-of-text ends the clip (a batch pads finished rows with it)
                    end = next((k for k in range(1, len(toks)) if toks[k] in eos), len(toks) - 1)
                    out[i] = toks[: end + 1]
                    if first_logits:
                        logits[i] = gen.logits[0][row].float().cpu().numpy()
        if first_logits:
            return out, np.stack(logits) if n else np.zeros((0, 0))
        return out
