"""Kokoro-82M (Apache-2.0) from a local weights folder, through the `kokoro` package.

The folder holds the files of the hexgrad/Kokoro-82M release (config.json, kokoro-v1_0.pth,
voices/<voice>.pt), fetched once and tracked with DVC; nothing is downloaded at run time. The first
letter of a voice names its language, the second its gender (f/m). Synthesis is made repeatable by
seeding torch from the text and voice before each utterance.

The folder layout and the packages it needs: docs/stimuli.md, "Kokoro voices".
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from voicebias.errors import ConfigError, StageFailed, VoicebiasError
from voicebias.tts import TTSBackend

MODEL_FILE = "kokoro-v1_0.pth"
CONFIG_FILE = "config.json"
SAMPLE_RATE = 24000
REPO_ID = "hexgrad/Kokoro-82M"
LANG_OF_PREFIX = {
    "a": "American English",
    "b": "British English",
    "e": "Spanish",
    "f": "French",
    "h": "Hindi",
    "i": "Italian",
    "j": "Japanese",
    "p": "Brazilian Portuguese",
    "z": "Mandarin",
}
GENDER_OF_LETTER = {"f": "female", "m": "male"}


class KokoroWeightsMissing(VoicebiasError, FileNotFoundError):
    """The local Kokoro-82M folder lacks a file; the message lists what and how to get it."""


def parse_voice(voice: str) -> tuple[str, str]:
    """'ef_dora' -> ('e', 'female'): the pipeline language code and the voice's gender."""
    if len(voice) < 4 or voice[2] != "_" or voice[0] not in LANG_OF_PREFIX or voice[1] not in GENDER_OF_LETTER:
        raise ConfigError(
            f"'{voice}' is not a Kokoro voice name like 'af_heart' or 'zm_yunxi' "
            f"(language letter {sorted(LANG_OF_PREFIX)}, gender letter f/m)"
        )
    return voice[0], GENDER_OF_LETTER[voice[1]]


def check_weights(folder: Path, voices: list[str] | None = None) -> None:
    """Raise KokoroWeightsMissing naming every missing file (model, config, voices)."""
    missing = [name for name in (CONFIG_FILE, MODEL_FILE) if not (folder / name).is_file()]
    missing += [f"voices/{v}.pt" for v in voices or [] if not (folder / "voices" / f"{v}.pt").is_file()]
    if missing:
        raise KokoroWeightsMissing(
            f"Kokoro-82M weights incomplete at {folder}: missing {', '.join(missing)}. On a machine with "
            f"internet, download the {REPO_ID} files ({CONFIG_FILE}, {MODEL_FILE}, voices/<voice>.pt) into that "
            "folder, `dvc add` it and `dvc push`; here, `dvc pull` it."
        )


def _seed(text: str, voice: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{voice}\n{text}".encode()).digest()[:4], "little")


class KokoroTTS(TTSBackend):
    """Kokoro-82M voices from a local folder (option `weights`)."""

    name = "kokoro"

    def __init__(
        self,
        weights: str | Path = "models/weights/Kokoro-82M",
        rate_wpm: int | None = None,
        speed: float = 1.0,
        device: str = "cpu",
    ):
        from voicebias.config import ROOT

        folder = Path(weights)
        self.weights = folder if folder.is_absolute() else ROOT / folder
        check_weights(self.weights)
        self.speed = float(speed)
        self.device = device
        self._model = None
        self._pipelines: dict[str, object] = {}

    def voice_gender(self, voice: str) -> str | None:
        return parse_voice(voice)[1]

    def _kokoro(self):
        # never let the package reach for the hub: every file comes from self.weights
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import kokoro
        except ImportError as exc:
            raise StageFailed(
                "the Kokoro backend needs the 'kokoro' package (pip install kokoro==0.9.4; "
                "for Mandarin also misaki[zh]==0.9.4)"
            ) from exc
        return kokoro

    def _pipeline(self, lang_code: str):
        if lang_code not in self._pipelines:
            kokoro = self._kokoro()
            if self._model is None:
                self._model = (
                    kokoro.KModel(
                        repo_id=REPO_ID, config=str(self.weights / CONFIG_FILE), model=str(self.weights / MODEL_FILE)
                    )
                    .to(self.device)
                    .eval()
                )
            self._pipelines[lang_code] = kokoro.KPipeline(lang_code=lang_code, repo_id=REPO_ID, model=self._model)
        return self._pipelines[lang_code]

    def synthesize(self, text: str, voice: str) -> tuple[np.ndarray, int]:
        if not text or not text.strip():
            raise ValueError("cannot synthesise empty text")
        lang_code, _ = parse_voice(voice)
        check_weights(self.weights, [voice])
        pipeline = self._pipeline(lang_code)
        import torch

        torch.manual_seed(_seed(text, voice))
        chunks = []
        with torch.no_grad():
            for result in pipeline(text, voice=str(self.weights / "voices" / f"{voice}.pt"), speed=self.speed):
                if result.audio is not None:
                    chunks.append(result.audio.detach().cpu().numpy().astype(np.float32))
        if not chunks:
            raise RuntimeError(f"Kokoro produced no audio for voice '{voice}'")
        return np.concatenate(chunks), SAMPLE_RATE

    def describe(self) -> dict[str, str]:
        return {"backend": self.name, "engine": f"Kokoro-82M ({self.weights.name})", "speed": str(self.speed)}
