"""Content keys and atomic on-disk caches.

`content_key(parts)` is the sha256 of the canonical JSON of `parts`, so the same parts give the same
key whatever the order of their dict entries. `JsonCache` stores one JSON value per key under a
folder, written atomically (a temporary file moved into place with os.replace), so a reader never
sees a partial entry; an entry that cannot be read back is a miss, counted in `corrupt`, and the
next `put` replaces it.

Typical use: docs/reproducibility.md, "Content keys and atomic caches".
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable


def canonical_json(parts: Any, default: Callable[[Any], Any] | None = str) -> str:
    """The JSON text a content key hashes: keys sorted, non-ASCII kept."""
    return json.dumps(parts, sort_keys=True, ensure_ascii=False, default=default)


def content_key(parts: Any) -> str:
    """sha256 (hex) of the canonical JSON of `parts`."""
    return hashlib.sha256(canonical_json(parts).encode()).hexdigest()


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(
    path: Path | str, value: Any, indent: int | None = None, default: Callable[[Any], Any] | None = str
) -> None:
    """`value` as JSON (non-ASCII kept) written atomically to `path`."""
    text = json.dumps(value, ensure_ascii=False, indent=indent, default=default)
    atomic_write_bytes(path, text.encode("utf-8"))


class JsonCache:
    """One JSON value per key under `root`, written atomically.

    `layout(key)` gives an entry's path relative to root (default "<key>.json", or
    "<key[:shard]>/<key>.json" with `shard`); a key may be any value the layout takes.
    `check(value)` (optional) says whether a value read back is a usable entry.
    Counters: `hits`, `misses` (corrupt entries included) and `corrupt`.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        shard: int = 0,
        layout: Callable[[Any], Path | str] | None = None,
        check: Callable[[Any], bool] | None = None,
        indent: int | None = None,
        default: Callable[[Any], Any] | None = str,
    ):
        self.root = Path(root)
        self.shard = int(shard)
        self.layout = layout
        self.check = check
        self.indent = indent
        self.default = default
        self.hits = self.misses = self.corrupt = 0
        self._lock = threading.Lock()

    def path(self, key: Any) -> Path:
        if self.layout is not None:
            return self.root / self.layout(key)
        name = f"{key}.json"
        return self.root / key[: self.shard] / name if self.shard else self.root / name

    def _count(self, **inc: int) -> None:
        with self._lock:
            for k, v in inc.items():
                setattr(self, k, getattr(self, k) + v)

    def get(self, key: Any) -> Any | None:
        """The stored value, or None when there is none or it cannot be read back."""
        p = self.path(key)
        try:
            value = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            self._count(misses=1)
            return None
        except (ValueError, UnicodeDecodeError, IsADirectoryError):
            self._count(misses=1, corrupt=1)
            return None
        if self.check is not None and not self.check(value):
            self._count(misses=1, corrupt=1)
            return None
        self._count(hits=1)
        return value

    def put(self, key: Any, value: Any) -> Path:
        """Store `value` under `key` (atomically replacing any earlier entry); returns its path."""
        p = self.path(key)
        atomic_write_json(p, value, indent=self.indent, default=self.default)
        return p

    def __contains__(self, key: Any) -> bool:
        return self.path(key).is_file()
