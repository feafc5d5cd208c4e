"""The render cache: each distinct utterance is rendered once, across tasks and systems.

An entry holds what one render gave: the waveform exactly as the renderer returned it, its sample
rate, and the FLAC file voicebias.audio.write_audio writes for it, so a hit encodes nothing. It is
keyed (voicebias.cache.content_key) by everything that decides those bytes: what is rendered, the
renderer's identity and the writer's. A render that raises is never stored. Entries are
`<root>/<key[:2]>/<key>.npz`, written atomically; an unreadable entry is a miss. The cache is not a
DVC output: deleting it costs time, never a different byte.

See docs/systems.md, "The render cache".
"""

from __future__ import annotations

import hashlib
import inspect
import io
import threading
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from voicebias.cache import atomic_write_bytes, content_key


@dataclass(frozen=True)
class Render:
    """One rendered utterance: waveform (float32), sample rate and its FLAC file's bytes."""

    audio: np.ndarray
    sample_rate: int
    flac: bytes


def source_sha256(*objects: Any) -> str:
    """sha256 (hex) of the source text of functions, classes or modules (strings taken as they are)."""
    h = hashlib.sha256()
    for obj in objects:
        h.update((obj if isinstance(obj, str) else inspect.getsource(obj)).encode())
    return h.hexdigest()


@lru_cache(maxsize=1)
def writer_identity() -> dict[str, str]:
    """What decides the FLAC bytes of a waveform: the writer's code and libraries."""
    import soundfile as sf

    from voicebias import audio

    return {
        "code": source_sha256(audio.write_audio, audio.flac_bytes),
        "soundfile": sf.__version__,
        "libsndfile": sf.__libsndfile_version__,
    }


def render_key(parts: dict[str, Any]) -> str:
    """The key of a render described by `parts` (what is rendered and the renderer's
    identity), with the writer's identity added."""
    return content_key({"render": parts, "writer": writer_identity()})


def make_render(audio: np.ndarray, sample_rate: int) -> Render:
    """A Render of a waveform, its FLAC bytes written by voicebias.audio.flac_bytes."""
    from voicebias.audio import flac_bytes

    audio = np.asarray(audio, dtype=np.float32)
    return Render(audio=audio, sample_rate=int(sample_rate), flac=flac_bytes(audio, int(sample_rate)))


class RenderCache:
    """Render entries under `root`, with hit, miss and corrupt counts."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self.hits = self.misses = self.corrupt = 0
        self._lock = threading.Lock()

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.npz"

    def _count(self, **inc: int) -> None:
        with self._lock:
            for k, v in inc.items():
                setattr(self, k, getattr(self, k) + v)

    def get(self, key: str) -> Render | None:
        """The stored render, or None when there is none or it cannot be read back."""
        try:
            data = self.path(key).read_bytes()
        except FileNotFoundError:
            self._count(misses=1)
            return None
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                audio, sr, flac = z["audio"], z["sample_rate"], z["flac"]
            ok = audio.dtype == np.float32 and audio.ndim == 1 and audio.size > 0 and flac.dtype == np.uint8
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            ok = False
        if not ok:
            self._count(misses=1, corrupt=1)
            return None
        self._count(hits=1)
        return Render(audio=audio, sample_rate=int(sr), flac=flac.tobytes())

    def put(self, key: str, render: Render) -> None:
        """Store `render` under `key`, atomically replacing any earlier entry."""
        buf = io.BytesIO()
        np.savez(
            buf,
            audio=np.asarray(render.audio, dtype=np.float32),
            sample_rate=np.int64(render.sample_rate),
            flac=np.frombuffer(render.flac, dtype=np.uint8),
        )
        atomic_write_bytes(self.path(key), buf.getvalue())

    def __contains__(self, key: str) -> bool:
        return self.path(key).is_file()
