"""Content keys and the atomic JSON cache."""

from __future__ import annotations

import hashlib
import json
import os
import threading

from voicebias.cache import JsonCache, atomic_write_bytes, content_key


def test_same_parts_in_any_dict_order_give_the_same_key():
    a = {"card": {"x": 1, "y": [1, 2]}, "prompt": "über", "seed": 3}
    b = {"seed": 3, "prompt": "über", "card": {"y": [1, 2], "x": 1}}
    assert content_key(a) == content_key(b)
    assert content_key(a) != content_key({**a, "seed": 4})
    # the key the response cache has always used: sha256 of sorted, non-ASCII JSON
    legacy = hashlib.sha256(json.dumps(a, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()
    assert content_key(a) == legacy


def test_round_trip_flat_and_sharded(tmp_path):
    flat = JsonCache(tmp_path / "flat")
    assert flat.get("k1") is None and flat.misses == 1
    flat.put("k1", {"text": "héllo", "n": [1, 2]})
    assert flat.get("k1") == {"text": "héllo", "n": [1, 2]} and flat.hits == 1
    assert (tmp_path / "flat" / "k1.json").is_file()
    sharded = JsonCache(tmp_path / "sh", shard=2)
    sharded.put("abcdef", 1.5)
    assert (tmp_path / "sh" / "ab" / "abcdef.json").is_file() and sharded.get("abcdef") == 1.5


def test_corrupt_entry_is_a_counted_miss_and_put_replaces_it(tmp_path):
    cache = JsonCache(tmp_path)
    cache.put("k", {"a": 1})
    (tmp_path / "k.json").write_text('{"a": 1', encoding="utf-8")  # truncated
    assert cache.get("k") is None
    assert cache.corrupt == 1 and cache.misses == 1
    checked = JsonCache(tmp_path, check=lambda v: isinstance(v, dict) and "a" in v)
    (tmp_path / "j.json").write_text("[1, 2]", encoding="utf-8")
    assert checked.get("j") is None and checked.corrupt == 1
    cache.put("k", {"a": 2})
    assert cache.get("k") == {"a": 2}


def test_write_is_atomic_no_partial_file_is_visible(tmp_path, monkeypatch):
    target = tmp_path / "entry.bin"
    atomic_write_bytes(target, b"old")
    seen: list[bytes] = []
    real_replace = os.replace

    def spying_replace(src, dst):
        seen.append(target.read_bytes())  # what a reader sees just before the move
        assert os.path.dirname(src) == os.path.dirname(str(dst))  # temp file in the same folder
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spying_replace)
    atomic_write_bytes(target, b"new" * 1000)
    assert seen == [b"old"] and target.read_bytes() == b"new" * 1000

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    try:
        atomic_write_bytes(target, b"never")
    except OSError:
        pass
    assert target.read_bytes() == b"new" * 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.bin"]  # no temp file left behind


def test_concurrent_writers_of_one_key_leave_a_whole_entry(tmp_path):
    cache = JsonCache(tmp_path)
    values = [{"i": i, "pad": "x" * 5000} for i in range(16)]
    threads = [threading.Thread(target=cache.put, args=("k", v)) for v in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.get("k") in values and cache.corrupt == 0
    assert [p.name for p in tmp_path.iterdir()] == ["k.json"]


def test_measurement_style_key_sha_plus_settings_tag(tmp_path):
    tag = content_key([{"pitch_floor": 75.0, "method": "dap"}, 16000])[:16]
    cache = JsonCache(tmp_path, default=float)
    import numpy as np

    cache.put(f"{'a' * 64}-{tag}", {"f0": np.float32(101.5)})
    assert cache.get(f"{'a' * 64}-{tag}") == {"f0": 101.5}
    assert (tmp_path / f"{'a' * 64}-{tag}.json").is_file()
