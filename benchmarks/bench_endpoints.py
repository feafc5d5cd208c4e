"""Benchmark: throughput of one system sharded across several endpoints, against one endpoint.

Fake OpenAI audio servers (tests/fakes/openai_server.py, real HTTP on 127.0.0.1) answer
every request after a fixed latency. The OpenAI-compatible adapter and the runner
(voicebias.systems.runner.run_task) send N requests into an empty cache, once to one
endpoint and once to K endpoints of the same capacity each, side by side in one run.
Ideal speed-up: K. Prints one JSON object with the ratio of the measured speed-up to K;
exits 1 when it is below --min-ratio or a request was not answered.

Usage: python benchmarks/bench_endpoints.py [--requests 60] [--endpoints 3] [--capacity 2] [--latency 0.2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fakes.openai_server import FakeOpenAIAudioServer  # noqa: E402
from tests.fakes.stimuli import make_stimuli  # noqa: E402
from voicebias.systems.catalog import build_system  # noqa: E402
from voicebias.systems.runner import ResponseCache, RetryPolicy, run_task  # noqa: E402
from voicebias.tasks import Task  # noqa: E402

KEY = "sk-bench-not-a-real-key"


def _run(root: Path, stim, urls: list[str], capacity: int, tag: str) -> tuple[float, int]:
    task = Task("describe", "benchmark", "same", {"en": "Say male or female."})
    endpoints = [{"url": u, "weight": 1, "max_concurrency": capacity} for u in urls]
    system = build_system("gpt_audio", {"endpoints": endpoints, "timeout_s": 30}, root=root)
    t0 = time.perf_counter()
    table, _ = run_task(
        system,
        task,
        stim,
        root / f"out-{tag}",
        ResponseCache(root / f"cache-{tag}"),
        1,
        root,
        policy=RetryPolicy(max_attempts=1),
        progress=False,
    )
    wall = time.perf_counter() - t0
    system.close()
    return wall, int((table["status"] == "ok").sum())


def bench(requests: int, endpoints: int, capacity: int, latency_s: float) -> dict:
    os.environ["OPENAI_API_KEY"] = KEY
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        os.environ["VOICEBIAS_ENDPOINTS"] = str(root / "none.json")  # no endpoints file of the user's
        stim = make_stimuli(root, requests, seconds=0.1)
        servers = [stack.enter_context(FakeOpenAIAudioServer(KEY, latency_s=latency_s)) for _ in range(endpoints)]
        wall1, ok1 = _run(root, stim, [servers[0].base_url], capacity, "one")
        wallk, okk = _run(root, stim, [s.base_url for s in servers], capacity, "many")
    speedup = wall1 / wallk
    return {
        "requests": requests,
        "endpoints": endpoints,
        "capacity_per_endpoint": capacity,
        "latency_s": latency_s,
        "wall_one_s": round(wall1, 3),
        "wall_many_s": round(wallk, 3),
        "speedup": round(speedup, 3),
        "ratio_to_ideal": round(speedup / endpoints, 3),
        "ok_one": ok1,
        "ok_many": okk,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--endpoints", type=int, default=3)
    ap.add_argument("--capacity", type=int, default=2, help="max_concurrency of each endpoint")
    ap.add_argument("--latency", type=float, default=0.2, help="fixed server latency per request (s)")
    ap.add_argument("--min-ratio", type=float, default=0.8)
    a = ap.parse_args()
    result = bench(a.requests, a.endpoints, a.capacity, a.latency)
    result["passed"] = result["ratio_to_ideal"] >= a.min_ratio and result["ok_one"] == result["ok_many"] == a.requests
    print(json.dumps(result, indent=2))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
