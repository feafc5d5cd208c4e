"""The render cache: an entry reads back exactly as stored, an unreadable one is a miss, the
FLAC bytes are those write_audio writes, and the key moves with every setting of the renderer."""

from __future__ import annotations

import numpy as np

from voicebias.audio import flac_bytes, flac_matches, write_audio
from voicebias.tts import get_backend
from voicebias.tts.render_cache import Render, RenderCache, make_render, render_key, writer_identity


def wave(n=4000, seed=0):
    return np.random.default_rng(seed).uniform(-1.1, 1.1, n).astype(np.float32)  # some samples clip


def test_flac_bytes_are_the_file_write_audio_writes(tmp_path):
    x = wave()
    write_audio(tmp_path / "a.flac", x, 22050)
    data = flac_bytes(x, 22050)
    assert data == (tmp_path / "a.flac").read_bytes()
    assert flac_matches(data, x, 22050)
    assert not flac_matches(data, x[:-1], 22050) and not flac_matches(data, x, 16000)
    assert not flac_matches(b"not a sound file", x, 22050)


def test_an_entry_reads_back_byte_for_byte(tmp_path):
    cache = RenderCache(tmp_path)
    r = make_render(wave(), 22050)
    assert cache.get("ab" * 32) is None and cache.misses == 1
    cache.put("ab" * 32, r)
    back = cache.get("ab" * 32)
    assert cache.hits == 1 and back.sample_rate == 22050
    assert back.audio.dtype == np.float32 and back.audio.tobytes() == r.audio.tobytes()
    assert back.flac == r.flac == flac_bytes(r.audio, 22050)
    assert list(tmp_path.rglob("*.npz")) == [cache.path("ab" * 32)]
    assert not list(tmp_path.rglob("*.tmp"))  # written through a temporary file, moved into place


def test_an_unreadable_entry_is_a_miss_and_is_replaced(tmp_path):
    cache = RenderCache(tmp_path)
    key = "cd" * 32
    cache.path(key).parent.mkdir(parents=True)
    cache.path(key).write_bytes(b"cut off")
    assert cache.get(key) is None and cache.corrupt == 1
    cache.put(key, Render(wave(10), 16000, b"x"))
    assert cache.get(key).flac == b"x"


def test_the_key_moves_with_every_setting_of_the_renderer():
    fast, slow = get_backend("espeak", rate_wpm=160), get_backend("espeak", rate_wpm=150)
    base = {"tts": fast.cache_identity(), "text": "male", "voice": "en-us+f2"}
    key = render_key(base)
    assert render_key(dict(base)) == key  # the same parts, the same key
    assert render_key({**base, "tts": slow.cache_identity()}) != key
    assert render_key({**base, "text": "female"}) != key
    assert render_key({**base, "voice": "en-us+f3"}) != key
    ident = fast.cache_identity()
    assert {"engine", "rate_wpm", "package", "library_sha256", "code"} <= set(ident)
    assert {"code", "soundfile", "libsndfile"} <= set(writer_identity())
