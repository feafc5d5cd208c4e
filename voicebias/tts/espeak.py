"""eSpeak NG through its C library (shipped by the `espeakng-loader` package).

The library is called, not copied (it is GPL-3.0). Synthesis is synchronous and
deterministic: the same text and voice give the same samples, whatever was
synthesised before (each utterance is made in a fresh child process, with the
library's random generator seeded from the text and voice).

The children are forked by a small helper process (`_Forker`, one per process that
synthesises), not by the caller: forking a stage's process, hundreds of megabytes
once pandas and Great Expectations are loaded, costs more than the synthesis itself.
The helper loads nothing of eSpeak NG; each child loads and initialises the library
afresh, as a child of the caller would.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import struct
import subprocess
import sys
import threading
from collections import OrderedDict
from functools import lru_cache
from pathlib import Path

import numpy as np

from voicebias.errors import ConfigError, StageFailed
from voicebias.tts import TTSBackend

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_ESPEAK_CHARS_UTF8 = 1
_ESPEAK_RATE = 1
_EE_OK = 0

_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)

_lock = threading.Lock()
_state: dict = {}


def _library():
    """Load and initialise libespeak-ng once per process."""
    if "lib" in _state:
        return _state["lib"], _state["rate"]
    try:
        import espeakng_loader
    except ImportError as exc:  # pragma: no cover - dependency is pinned
        raise StageFailed("eSpeak NG backend needs the 'espeakng-loader' package") from exc
    lib = ctypes.CDLL(espeakng_loader.get_library_path())
    data_parent = str(Path(espeakng_loader.get_data_path()).parent).encode()
    lib.espeak_Initialize.restype = ctypes.c_int
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    rate = lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data_parent, 0)
    if rate <= 0:
        raise RuntimeError(f"espeak_Initialize failed (returned {rate})")
    lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
    lib.espeak_SetVoiceByName.restype = ctypes.c_int
    lib.espeak_SetParameter.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.espeak_Synth.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_uint,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_uint,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    lib.espeak_Synth.restype = ctypes.c_int
    lib.espeak_ng_SetRandSeed.argtypes = [ctypes.c_long]
    chunks: list[np.ndarray] = []

    def collect(wav, n, _events):
        if n > 0 and wav:
            chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        return 0

    cb = _CALLBACK(collect)
    lib.espeak_SetSynthCallback(cb)
    _state.update(lib=lib, rate=rate, chunks=chunks, cb=cb)
    return lib, rate


def _seed(text: str, voice: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{voice}\n{text}".encode()).digest()[:4], "little")


def _synthesize_here(text: str, voice: str, rate_wpm: int) -> tuple[int, int, np.ndarray]:
    """(status, sample rate, int16 samples); status 0 ok, 1 unknown voice, 2 synth error."""
    lib, rate = _library()
    if lib.espeak_SetVoiceByName(voice.encode()) != _EE_OK:
        return 1, rate, np.zeros(0, np.int16)
    lib.espeak_SetParameter(_ESPEAK_RATE, rate_wpm, 0)
    lib.espeak_ng_SetRandSeed(_seed(text, voice))
    chunks = _state["chunks"]
    chunks.clear()
    data = text.encode("utf-8")
    buf = ctypes.create_string_buffer(data)
    err = lib.espeak_Synth(buf, len(data) + 1, 0, 0, 0, _ESPEAK_CHARS_UTF8, None, None)
    lib.espeak_Synchronize()
    pcm = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    chunks.clear()
    return (0 if err == _EE_OK else 2), rate, pcm.astype(np.int16)


def _synthesize_fresh(text: str, voice: str, rate_wpm: int) -> tuple[int, int, np.ndarray]:
    """Synthesise in a forked child that loads the library afresh.

    libespeak-ng keeps wave-generator state across utterances (even across
    espeak_Terminate/espeak_Initialize), so the same text can come out a few samples
    different depending on what was spoken before. A fresh process per utterance
    makes every file depend on its text and voice alone.
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 3
        try:
            os.close(read_fd)
            status, rate, pcm = _synthesize_here(text, voice, rate_wpm)
            payload = struct.pack("<iiq", status, rate, pcm.size) + pcm.tobytes()
            view = memoryview(payload)
            while view:
                n = os.write(write_fd, view)
                view = view[n:]
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    parts = []
    while True:
        block = os.read(read_fd, 1 << 20)
        if not block:
            break
        parts.append(block)
    os.close(read_fd)
    _, exit_status = os.waitpid(pid, 0)
    data = b"".join(parts)
    if exit_status != 0 or len(data) < 16:
        raise RuntimeError(f"eSpeak NG worker process failed for voice '{voice}' (exit status {exit_status})")
    status, rate, n = struct.unpack("<iiq", data[:16])
    return status, rate, np.frombuffer(data[16 : 16 + 2 * n], dtype=np.int16)


#: the last utterances synthesised in this process, (text, voice, rate) -> (sample rate, int16
#: samples): an utterance depends on these alone, so one said again (the continuation
#: reference says each sentence once per phonation condition) is not synthesised again
_RECENT: "OrderedDict[tuple[str, str, int], tuple[int, np.ndarray]]" = OrderedDict()
_RECENT_KEPT = 16

_REPLY = struct.Struct("<iiiq")  # 0 ok / 1 failed, status, rate, samples (or message bytes)


def _read_exactly(stream, n: int) -> bytes:
    parts, left = [], n
    while left:
        block = stream.read(left)
        if not block:
            break
        parts.append(block)
        left -= len(block)
    return b"".join(parts)


def _serve() -> None:
    """The helper's loop: one request in (rate, voice, text), one fresh child per
    request (`_synthesize_fresh`), its samples out; ends when the caller closes stdin."""
    import espeakng_loader  # noqa: F401  (pure Python: the children then only load the library)

    requests, replies = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the replies
    while True:
        head = _read_exactly(requests, 12)
        if len(head) < 12:
            return
        rate_wpm, n_voice, n_text = struct.unpack("<iii", head)
        voice = _read_exactly(requests, n_voice).decode("utf-8")
        text = _read_exactly(requests, n_text).decode("utf-8")
        try:
            status, rate, pcm = _synthesize_fresh(text, voice, rate_wpm)
            reply = _REPLY.pack(0, status, rate, pcm.size) + pcm.tobytes()
        except Exception as exc:  # the child failed: say so, keep serving
            msg = str(exc).encode("utf-8")
            reply = _REPLY.pack(1, 0, 0, len(msg)) + msg
        replies.write(reply)
        replies.flush()


class _Forker:
    """The helper process of the calling process (see the module docstring), started
    at its first utterance; a forked copy of the caller starts its own."""

    _current: "_Forker | None" = None

    def __init__(self):
        package_parent = str(Path(__file__).resolve().parents[2])  # the voicebias this process runs
        code = f"import sys; sys.path.insert(0, {package_parent!r}); from voicebias.tts.espeak import _serve; _serve()"
        self.owner = os.getpid()
        from voicebias.secrets import child_env

        # the allow-listed environment: no key of this process reaches the helper
        env = child_env(names=("ESPEAK_DATA_PATH", "PYTHONPATH", "VIRTUAL_ENV"))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        # closed when this process exits: atexit in a main process, and also in a
        # multiprocessing worker, which skips atexit but runs these finalizers
        from multiprocessing import util

        util.Finalize(None, self.close, exitpriority=0)

    @classmethod
    def get(cls) -> "_Forker":
        f = cls._current
        if f is None or f.owner != os.getpid() or f.proc.poll() is not None:
            f = cls._current = cls()
        return f

    def synthesize(self, text: str, voice: str, rate_wpm: int) -> tuple[int, int, np.ndarray]:
        v, t = voice.encode("utf-8"), text.encode("utf-8")
        try:
            self.proc.stdin.write(struct.pack("<iii", rate_wpm, len(v), len(t)) + v + t)
            self.proc.stdin.flush()
            head = _read_exactly(self.proc.stdout, _REPLY.size)
            failed, status, rate, n = _REPLY.unpack(head) if len(head) == _REPLY.size else (2, 0, 0, 0)
            body = _read_exactly(self.proc.stdout, 2 * n if failed == 0 else n)
        except OSError:
            failed, body = 2, b""
        if failed == 1:
            raise RuntimeError(body.decode("utf-8", "replace"))
        if failed or len(body) < 2 * n:
            self.close()
            raise RuntimeError(f"eSpeak NG helper process failed for voice '{voice}'")
        return status, rate, np.frombuffer(body, dtype=np.int16)

    def close(self) -> None:
        if self.owner != os.getpid():
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if _Forker._current is self:
            _Forker._current = None


class EspeakTTS(TTSBackend):
    """eSpeak NG formant synthesis; voices are 'language+variant' (e.g. 'en-us+f4')."""

    name = "espeak"
    processes = True

    def __init__(self, rate_wpm: int = 160):
        self.rate_wpm = int(rate_wpm)

    def synthesize(self, text: str, voice: str) -> tuple[np.ndarray, int]:
        if not text or not text.strip():
            raise ValueError("cannot synthesise empty text")
        key = (text, voice, self.rate_wpm)
        with _lock:
            if key in _RECENT:
                _RECENT.move_to_end(key)
                status, rate, pcm = 0, *_RECENT[key]
            else:
                status, rate, pcm = _Forker.get().synthesize(text, voice, self.rate_wpm)
                if status == 0 and pcm.size:
                    _RECENT[key] = (rate, pcm)
                    while len(_RECENT) > _RECENT_KEPT:
                        _RECENT.popitem(last=False)
        if status == 1:
            raise ConfigError(f"eSpeak NG has no voice '{voice}'")
        if status == 2:
            raise RuntimeError(f"espeak_Synth failed for voice '{voice}'")
        if pcm.size == 0:
            raise RuntimeError(f"eSpeak NG produced no audio for voice '{voice}'")
        return (pcm.astype(np.float32) / 32768.0), rate

    def describe(self) -> dict[str, str]:
        return {
            "backend": self.name,
            "engine": "eSpeak NG 1.52 (espeakng-loader 0.2.4)",
            "rate_wpm": str(self.rate_wpm),
        }

    def cache_identity(self) -> dict[str, str]:
        """The description, with the installed library's sha256, its package's version and
        the source of this module (which calls the library and seeds it)."""
        return {**self.describe(), **_engine_identity()}


@lru_cache(maxsize=1)
def _engine_identity() -> dict[str, str]:
    import sys
    from importlib.metadata import version

    import espeakng_loader

    from voicebias.audio import sha256_file
    from voicebias.tts.render_cache import source_sha256

    return {
        "package": f"espeakng-loader {version('espeakng-loader')}",
        "library_sha256": sha256_file(espeakng_loader.get_library_path()),
        "code": source_sha256(sys.modules[__name__]),
    }
