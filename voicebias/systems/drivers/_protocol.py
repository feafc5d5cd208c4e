"""Line protocol shared by the drivers (standard library + numpy only).

The driver's stdout is moved to stderr before the model loads, so prints from the
repository's code cannot corrupt the protocol; answers go to the original stdout.
Startup: one line {"ready": true, "info": {...}}. Then, per request line
{"id", "audio", "out", "prompt", "seed", ...}: one line {"id", "status": "ok",
"text": ...} (audio written to `out`) or {"id", "status": "failed", "error": ...}.
"""

from __future__ import annotations

import json
import os
import random
import sys
import traceback
import wave
from typing import Any, Callable

import numpy as np


def to_numpy(x: Any) -> np.ndarray:
    """A 1-D float array from a tensor, list or array."""
    if hasattr(x, "detach"):
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32).reshape(-1)


def write_wav(path: str, samples: Any, sample_rate: int) -> None:
    """16-bit mono WAV with the standard library."""
    x = np.clip(to_numpy(samples), -1.0, 1.0)
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(int(sample_rate))
        w.writeframes((x * 32767).astype("<i2").tobytes())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    try:
        import torch

        torch.manual_seed(seed)
        if torch.cuda.is_available():
            torch.cuda.manual_seed_all(seed)
    except ImportError:
        pass


def serve(load: Callable[[dict], tuple[Any, dict]], handle: Callable[[Any, dict], dict]) -> None:
    """Load the model with `load(config)` -> (state, info), then answer requests with `handle`."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    config = json.loads(sys.argv[1])
    state, info = load(config)
    seed_everything(0)  # imports torch now, so the first request's time limit does not pay for it
    proto.write(json.dumps({"ready": True, "info": info}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            seed_everything(int(req.get("seed", 0)))
            result = handle(state, req)
            reply = {"id": req["id"], "status": "ok", **result}
        except Exception as exc:  # one bad input is reported, the worker goes on
            traceback.print_exc()
            reply = {"id": req["id"], "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        proto.write(json.dumps(reply) + "\n")


def revision(weights: str | None) -> str:
    """The weights' commit when the folder came from a hub download, else its name."""
    if not weights:
        return ""
    for name in ("commit", ".commit", "refs/main"):
        p = os.path.join(weights, name)
        if os.path.isfile(p):
            with open(p, encoding="utf-8") as fh:
                return fh.read().strip()
    return os.path.basename(os.path.normpath(weights))
