"""The response cache's integrity: an entry whose audio is missing, damaged or replaced is a
miss (called again, counted as corrupt in the run log); writers of one entry at once leave
one whole entry."""

import json
import multiprocessing
import threading

import numpy as np
import pytest
import soundfile as sf

from tests.support.systems import CountingSystem, stimuli
from voicebias.audio import flac_bytes, sha256_file
from voicebias.runlog import split_counts
from voicebias.systems.base import S2SResponse
from voicebias.systems.runner import ResponseCache, run_task
from voicebias.tasks import load_tasks


def _first_run(tmp_path, n=3):
    task = load_tasks()["describe"]
    cache = ResponseCache(tmp_path / "cache")
    system = CountingSystem()
    table, _ = run_task(system, task, stimuli(tmp_path, n), tmp_path / "o1", cache, 1, tmp_path, progress=False)
    return task, system, table


def _again(tmp_path, task, system, out="o2"):
    cache = ResponseCache(tmp_path / "cache")  # a new stage run: a fresh cache object
    return run_task(system, task, stimuli(tmp_path, 3), tmp_path / out, cache, 1, tmp_path, progress=False)


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # the header (and its declared length) stays


def _garbage(path):
    path.write_bytes(b"\x00garbage, not a sound file\n" * 20)


def _other_audio(path):
    path.write_bytes(flac_bytes(np.full(800, 0.2, np.float32), 16000))  # a good FLAC, not the one stored


@pytest.mark.parametrize(
    "damage",
    [_truncate, _garbage, _other_audio, lambda p: p.unlink()],
    ids=["truncated", "garbage", "replaced", "missing"],
)
def test_a_damaged_cached_audio_file_is_called_again_and_counted(tmp_path, damage):
    task, system, table1 = _first_run(tmp_path)
    key = table1["cache_key"].iloc[1]
    damage(ResponseCache(tmp_path / "cache").audio_path(key))
    table2, counts = _again(tmp_path, task, system)
    assert system.calls == 4 and counts["calls"] == 1 and counts["cache_hits"] == 2 and counts["corrupt"] == 1
    assert (table2["status"] == "ok").all()
    # the answer called again is whole: 1600 samples at 16 kHz, the file decodes, the entry is repaired
    assert table2["output_duration_s"].tolist() == [0.1] * 3
    assert len(sf.read(tmp_path / table2["output_audio"].iloc[1])[0]) == 1600
    tracked, run_facts = split_counts(counts)
    assert "corrupt" not in tracked and run_facts["corrupt"] == 1  # the run log, never a tracked output
    _, counts3 = _again(tmp_path, task, system, "o3")
    assert counts3["calls"] == 0 and counts3["corrupt"] == 0 and system.calls == 4


def test_an_unreadable_record_is_called_again_and_counted(tmp_path):
    task, system, table1 = _first_run(tmp_path)
    key = table1["cache_key"].iloc[0]
    (tmp_path / "cache" / key[:2] / key / "response.json").write_text('{"status": "ok", "trans')
    _, counts = _again(tmp_path, task, system)
    assert counts["calls"] == 1 and counts["corrupt"] == 1


def test_an_entry_written_before_audio_hashes_is_kept_when_its_audio_decodes(tmp_path):
    """A cache from before the hash was recorded is not thrown away: its entries are served while
    their audio decodes in full, and an entry whose audio does not is called again."""
    task, system, table1 = _first_run(tmp_path)
    cache = ResponseCache(tmp_path / "cache")
    for key in table1["cache_key"]:
        path = tmp_path / "cache" / key[:2] / key / "response.json"
        record = json.loads(path.read_text())
        assert record["output_audio_sha256"] == sha256_file(cache.audio_path(key))
        del record["output_audio_sha256"]
        path.write_text(json.dumps(record))
    _truncate(cache.audio_path(table1["cache_key"].iloc[2]))
    table2, counts = _again(tmp_path, task, system)
    assert counts["cache_hits"] == 2 and counts["calls"] == 1 and counts["corrupt"] == 1
    assert table2.drop(columns="output_audio").equals(table1.drop(columns="output_audio"))


def _response(i):
    """A distinct answer per writer and round: its audio level encodes `i`."""
    return S2SResponse("ok", f"answer {i}", np.full(1600, 0.001 * (i + 1), np.float32), 16000)


def _assert_one_whole_entry(root, key, answers):
    cache = ResponseCache(root)
    record = cache.get(key)
    assert record is not None and cache.corrupt == 0
    i = answers.index(record["transcript"])
    x, sr = sf.read(cache.audio_path(key), dtype="float32")
    assert sr == 16000 and np.allclose(x, 0.001 * (i + 1), atol=1e-4)  # record and audio of the same answer
    assert [p.name for p in (root / key[:2]).iterdir()] == [key]  # no folder of a writer left behind


def test_threads_writing_one_entry_at_once_leave_one_whole_entry(tmp_path):
    cache, key, n, rounds = ResponseCache(tmp_path), "ab" * 32, 6, 15
    barrier, errors = threading.Barrier(n), []

    def writer(w):
        try:
            barrier.wait()
            for r in range(rounds):
                i = w * rounds + r
                cache.put(key, {"status": "ok", "transcript": f"answer {i}"}, _response(i))
        except BaseException as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    _assert_one_whole_entry(tmp_path, key, [f"answer {i}" for i in range(n * rounds)])


def _process_writer(root, key, w, rounds, barrier):
    from pathlib import Path

    cache = ResponseCache(Path(root))
    barrier.wait()
    for r in range(rounds):
        i = w * rounds + r
        cache.put(key, {"status": "ok", "transcript": f"answer {i}"}, _response(i))


def test_processes_writing_one_entry_at_once_leave_one_whole_entry(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    key, n, rounds = "cd" * 32, 2, 40
    barrier = ctx.Barrier(n)
    procs = [ctx.Process(target=_process_writer, args=(str(tmp_path), key, w, rounds, barrier)) for w in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0] * n  # a writer that raised exits 1
    _assert_one_whole_entry(tmp_path, key, [f"answer {i}" for i in range(n * rounds)])


def test_the_corrupt_count_goes_to_the_run_log_and_the_mlflow_run(tmp_path):
    from voicebias.report.tracking import _run_log_metrics
    from voicebias.runlog import latest, record

    task, system, table1 = _first_run(tmp_path)
    _garbage(ResponseCache(tmp_path / "cache").audio_path(table1["cache_key"].iloc[0]))
    _, counts = _again(tmp_path, task, system)
    log = tmp_path / "runs.jsonl"
    record("respond@counting-describe", split_counts(counts)[1], log)
    assert latest(log)["respond@counting-describe"]["corrupt"] == 1
    metrics = {m.key: m.value for m in _run_log_metrics(latest(log))}
    assert metrics["run/respond/counting-describe/corrupt"] == 1.0
