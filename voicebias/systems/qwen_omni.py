"""Qwen2.5-Omni through transformers (native support): speech in, 24 kHz speech and text out.

Loads Qwen2_5OmniForConditionalGeneration and the audio and text parts of Qwen2_5OmniProcessor
from a local folder only, at the first call that is not a cache hit. The model's own system prompt
is sent (it speaks only under it), so the native task prompt goes in the user turn after the
audio; the output voice is a built-in speaker fixed across the audit.

The conversation, the params and the defaults: docs/systems.md, "Qwen2.5-Omni through transformers".
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from voicebias.audio import read_audio
from voicebias.errors import SetupError
from voicebias.io import resolve_path
from voicebias.systems.base import S2SRequest, S2SResponse, S2SSystem

QWEN_SYSTEM = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
    "auditory and visual inputs, as well as generating text and speech."
)
INPUT_RATE = 16000  # Hz, the processor's audio rate
OUTPUT_RATE = 24000  # Hz, the talker/token2wav output rate
MODEL_TYPE = "qwen2_5_omni"
#: the placeholders Qwen2_5OmniProcessor reads from the tokenizer, with the checkpoint's spelling as fallback
PLACEHOLDERS = {
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}


def check_weights(folder: Path, name: str) -> dict[str, Any]:
    """The folder's config.json, or a SetupError saying what is wrong with the folder."""
    if not folder.is_dir():
        raise SetupError(
            f"system '{name}': Qwen2.5-Omni weights expected at {folder} are missing; download "
            "Qwen/Qwen2.5-Omni-7B there (they are never fetched at run time)"
        )
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        raise SetupError(f"system '{name}': {folder} holds no config.json: not a saved transformers model")
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    if cfg.get("model_type") != MODEL_TYPE:
        raise SetupError(
            f"system '{name}': {folder} holds a '{cfg.get('model_type')}' model, not Qwen2.5-Omni "
            f"(model_type '{MODEL_TYPE}')"
        )
    return cfg


def load_processor(folder: Path) -> Any:
    """Qwen2_5OmniProcessor without its image and video processors, loaded from `folder`.

    A subclass whose constructor takes only the feature extractor and the tokenizer
    (transformers loads the sub-processors an __init__ names); the audio and text
    handling (audio placeholder expansion, feature extraction, chat template) is
    Qwen2_5OmniProcessor's own.
    """
    from transformers import Qwen2_5OmniProcessor
    from transformers.processing_utils import ProcessorMixin

    class Qwen2_5OmniAudioTextProcessor(Qwen2_5OmniProcessor):
        def __init__(self, feature_extractor=None, tokenizer=None, chat_template=None):
            ProcessorMixin.__init__(self, feature_extractor, tokenizer, chat_template=chat_template)
            for name, default in PLACEHOLDERS.items():
                token = getattr(tokenizer, name, None) or default
                setattr(self, name, token)
                if name in ("image_token", "audio_token", "video_token"):
                    setattr(self, f"{name}_id", tokenizer.convert_tokens_to_ids(token))

        @property
        def model_input_names(self) -> list[str]:
            return list(
                dict.fromkeys(
                    self.tokenizer.model_input_names
                    + self.feature_extractor.model_input_names
                    + ["feature_attention_mask"]
                )
            )

    return Qwen2_5OmniAudioTextProcessor.from_pretrained(str(folder), local_files_only=True)


class QwenOmniSystem(S2SSystem):
    """Qwen2.5-Omni as a speech-to-speech system under test."""

    max_concurrency = 1

    def __init__(self, name: str, card: dict[str, Any], params: dict[str, Any], root: Path | None = None):
        super().__init__(name, card, params)
        weights = params.get("weights") or (card.get("requires") or {}).get("weights")
        if not weights:
            raise ValueError(f"system '{name}': no weights folder (params 'weights' or card requires.weights)")
        self.weights = resolve_path(weights, root)
        self.config = check_weights(self.weights, name)
        self.device = str(params["device"])
        if self.device.startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                raise SetupError(
                    f"system '{name}' needs a CUDA GPU (device '{self.device}'), and none is visible "
                    "to PyTorch; set device: cpu to run it (very slowly) on the CPU"
                )
        voices = card.get("output_voice") or {}
        self.speaker = str(
            params.get("speaker") or (voices if isinstance(voices, str) else next(iter(voices.values()), "Chelsie"))
        )
        digest = hashlib.sha256((self.weights / "config.json").read_bytes()).hexdigest()[:12]
        self.revision = f"{self.weights.name}@config-{digest}"
        self._model = None
        self._processor = None
        self._lock = threading.Lock()

    def _load(self) -> None:
        if self._model is not None:
            return
        try:
            import torch
            from transformers import Qwen2_5OmniForConditionalGeneration

            processor = load_processor(self.weights)
            dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
            model = (
                Qwen2_5OmniForConditionalGeneration.from_pretrained(
                    str(self.weights), local_files_only=True, dtype=dtype
                )
                .to(self.device)
                .eval()
            )
        except (OSError, ValueError, ImportError) as exc:
            raise SetupError(
                f"system '{self.name}': Qwen2.5-Omni cannot be loaded from {self.weights}: {exc}"
            ) from None
        if self.speaker not in model.speaker_map:
            raise SetupError(
                f"system '{self.name}': speaker '{self.speaker}' is not among the checkpoint's built-in "
                f"voices ({', '.join(sorted(model.speaker_map)) or 'none: spk_dict.pt is empty'})"
            )
        self._processor, self._model = processor, model

    def conversation(self, request: S2SRequest, audio: Any) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": [{"type": "text", "text": QWEN_SYSTEM}]},
            {"role": "user", "content": [{"type": "audio", "audio": audio}, {"type": "text", "text": request.prompt}]},
        ]

    def generate_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of model.generate besides the inputs (from the params)."""
        gen: dict[str, Any] = {
            "speaker": self.speaker,
            "generation_mode": "audio",
            "use_audio_in_video": False,
            "thinker_max_new_tokens": int(self.params["thinker_max_new_tokens"]),
        }
        if self.params.get("temperature") is not None:
            temperature = float(self.params["temperature"])
            gen["thinker_do_sample"] = temperature > 0
            if temperature > 0:
                gen["thinker_temperature"] = temperature
        if "talker_do_sample" in self.params:
            gen["talker_do_sample"] = bool(self.params["talker_do_sample"])
        if self.params.get("talker_max_new_tokens") is not None:
            gen["talker_max_new_tokens"] = int(self.params["talker_max_new_tokens"])
        return gen

    def respond(self, request: S2SRequest) -> S2SResponse:
        import torch

        with self._lock:
            self._load()
            x, _ = read_audio(request.audio_path, target_sr=INPUT_RATE)
            proc, model = self._processor, self._model
            text = proc.apply_chat_template(self.conversation(request, x), add_generation_prompt=True, tokenize=False)
            inputs = proc(text=text, audio=[x], return_tensors="pt", padding=True).to(self.device)
            torch.manual_seed(int(request.seed))
            gen = self.generate_kwargs()
            with torch.no_grad():
                out = model.generate(**inputs, **gen)
            text_ids, audio = out if isinstance(out, tuple) else (out, None)
            new = text_ids[:, inputs["input_ids"].shape[1] :]
            transcript = proc.batch_decode(new, skip_special_tokens=True)[0].strip()
        prov = {"model_revision": self.revision, "speaker": self.speaker, "device": self.device}
        if audio is None or audio.numel() == 0:
            return S2SResponse.failed("the model returned text without audio", **prov)
        samples = audio.reshape(-1).float().cpu().numpy()
        return S2SResponse(
            status="ok", transcript=transcript or None, audio=samples, sample_rate=OUTPUT_RATE, provenance=prov
        )

    def close(self) -> None:
        self._model = None
        self._processor = None
