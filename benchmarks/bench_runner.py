"""Benchmark: does the runner's bounded concurrency keep API calls near the ideal wall time?

A fake OpenAI audio server (tests/fakes/openai_server.py, real HTTP on 127.0.0.1)
answers every request after a fixed latency. The OpenAI adapter and the runner
(voicebias.systems.runner.run_task) send N requests at concurrency C into an empty cache.
Ideal wall time: ceil(N / C) x latency. Acceptance (issue 6): within 1.3x of N / C x latency.

Usage: python benchmarks/bench_runner.py [--requests 180] [--concurrency 8] [--latency 0.5]
Prints one JSON object; exits 1 when the ratio exceeds --max-ratio.
"""

from __future__ import annotations

import argparse
import json
import math
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


def bench(requests: int, concurrency: int, latency_s: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        stim = make_stimuli(root, requests, seconds=0.1)
        task = Task("describe", "benchmark", "same", {"en": "Say male or female."})
        os.environ["OPENAI_API_KEY"] = KEY
        with FakeOpenAIAudioServer(KEY, latency_s=latency_s) as server:
            system = build_system(
                "gpt_audio", {"base_url": server.base_url, "max_concurrency": concurrency, "timeout_s": 30}, root=root
            )
            t0 = time.perf_counter()
            table, counts = run_task(
                system,
                task,
                stim,
                root / "out",
                ResponseCache(root / "cache"),
                1,
                root,
                policy=RetryPolicy(max_attempts=1),
                progress=False,
            )
            wall = time.perf_counter() - t0
            system.close()
        first = min(e.t_start for e in server.log)
        last = max(e.t_end for e in server.log)
    ideal = requests / concurrency * latency_s
    return {
        "requests": requests,
        "concurrency": concurrency,
        "latency_s": latency_s,
        "ideal_s": round(ideal, 3),
        "ideal_rounds_s": round(math.ceil(requests / concurrency) * latency_s, 3),
        "wall_s": round(wall, 3),
        "ratio": round(wall / ideal, 3),
        "server_busy_s": round(last - first, 3),
        "max_in_flight": server.max_in_flight,
        "ok": int((table["status"] == "ok").sum()),
        "calls": counts["calls"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=180)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--latency", type=float, default=0.5, help="fixed server latency per request (s)")
    ap.add_argument("--max-ratio", type=float, default=1.3)
    a = ap.parse_args()
    result = bench(a.requests, a.concurrency, a.latency)
    result["passed"] = result["ratio"] <= a.max_ratio and result["ok"] == a.requests
    print(json.dumps(result, indent=2))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
