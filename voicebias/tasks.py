"""Tasks as data: native-language prompts and scoring lexica live under data/tasks/."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from voicebias.config import TASKS_DIR
from voicebias.errors import NotFound
from voicebias.io import read_yaml

TASK_NAMES = ("readback", "paraphrase", "summarize", "translate", "describe")


@dataclass(frozen=True)
class Task:
    name: str
    role: str
    output_lang: str  # 'same' or a language code
    prompts: dict[str, str]

    def languages(self) -> list[str]:
        """Source languages this task runs on (translate: es and zh only)."""
        return sorted(self.prompts)

    def prompt(self, lang: str) -> str:
        if lang not in self.prompts:
            raise NotFound(f"task '{self.name}' has no prompt for language '{lang}'")
        return self.prompts[lang]

    def target_lang(self, source_lang: str) -> str:
        return source_lang if self.output_lang == "same" else self.output_lang


@lru_cache(maxsize=4)
def load_tasks(tasks_dir: Path = TASKS_DIR) -> dict[str, Task]:
    spec = read_yaml(Path(tasks_dir) / "prompts.yaml")
    return {name: Task(name, t["role"], str(t["output_lang"]), dict(t["prompts"])) for name, t in spec["tasks"].items()}


@lru_cache(maxsize=4)
def load_lexicon(tasks_dir: Path = TASKS_DIR) -> dict:
    return read_yaml(Path(tasks_dir) / "lexicon.yaml")
