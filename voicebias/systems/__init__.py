"""Systems under test: a string-keyed registry with lazy "module:Class" imports.

Adding a system is one adapter file plus one card under models/cards/.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml

from voicebias.config import CARDS_DIR
from voicebias.systems.base import S2SRequest, S2SResponse, S2SSystem, TransientError

ADAPTERS: dict[str, str] = {
    "reference": "voicebias.systems.reference:ReferenceSystem",
}

# Adapters of the paper profile that this version does not ship yet: the preflight
# names them so a user sees what is missing instead of a traceback.
PLANNED_ADAPTERS: dict[str, str] = {
    "openai_audio": "OpenAI audio chat completions (gpt-4o-audio / gpt-audio, voice alloy)",
    "gemini_live": "Gemini Live native audio (voice Kore)",
    "qwen_omni": "Qwen2.5-Omni through transformers",
    "kimi_audio": "Kimi-Audio-7B-Instruct (own repository and environment)",
    "glm4_voice": "GLM-4-Voice-9B (own repository and environment)",
    "step_audio2": "Step-Audio-2-mini (own repository and environment)",
}

__all__ = ["S2SRequest", "S2SResponse", "S2SSystem", "TransientError", "load_card", "build_system"]


def load_card(name: str, cards_dir: Path = CARDS_DIR) -> dict[str, Any]:
    path = Path(cards_dir) / f"{name}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"no system card for '{name}' (expected {path})")
    with open(path, encoding="utf-8") as fh:
        card = yaml.safe_load(fh)
    for key in ("adapter", "output_voice", "licence"):
        if key not in card:
            raise ValueError(f"system card {path} lacks '{key}'")
    return card


def build_system(name: str, params: dict[str, Any], cards_dir: Path = CARDS_DIR, **context: Any) -> S2SSystem:
    card = load_card(name, cards_dir)
    adapter = card["adapter"]
    if adapter not in ADAPTERS:
        if adapter in PLANNED_ADAPTERS:
            raise NotImplementedError(
                f"system '{name}' needs the '{adapter}' adapter ({PLANNED_ADAPTERS[adapter]}), "
                "which this version does not ship yet")
        raise KeyError(f"system '{name}': unknown adapter '{adapter}'")
    module, cls = ADAPTERS[adapter].split(":")
    return getattr(importlib.import_module(module), cls)(name, card, params, **context)
