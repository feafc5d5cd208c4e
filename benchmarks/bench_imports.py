"""Benchmark: what each stage process pays before it does any work.

For every stage script of dvc.yaml, the wall time of a fresh interpreter that imports it
(`python -c "import stages.<name>"`, best of --repeats) and the three heaviest modules of
that import (python -X importtime, cumulative); then the libraries stages import when
they run: Great Expectations (every stage that validates a table), statsmodels, torch,
parselmouth, MLflow. Not a test: run it by hand,

    .venv/bin/python benchmarks/bench_imports.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ["great_expectations", "statsmodels.api", "torch", "parselmouth", "mlflow", "pandas", "scipy.signal"]


def wall(code: str, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return min(times)


def heaviest(module: str, n: int = 3) -> list[tuple[str, float]]:
    err = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stderr
    rows = []
    for line in err.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|(\s*)(\S+)", line)
        name = m.group(3) if m else ""
        if m and "." not in name and not name.startswith(("stages", "voicebias", "_", "site", "encodings")):
            rows.append((name, int(m.group(1)) / 1e6))
    return sorted(rows, key=lambda r: -r[1])[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    base = wall("pass", a.repeats)
    print(f"interpreter start-up: {base:.2f} s\n")
    print("| stage script | import (s) | heaviest imports (cumulative s) |\n|---|---|---|")
    for script in sorted((ROOT / "stages").glob("*.py")):
        if script.name == "__init__.py":
            continue
        mod = f"stages.{script.stem}"
        heavy = ", ".join(f"{m} {s:.2f}" for m, s in heaviest(mod))
        print(f"| {script.stem} | {wall(f'import {mod}', a.repeats):.2f} | {heavy} |")
    print("\n| library, imported when a stage runs | import (s) |\n|---|---|")
    for lib in RUNTIME:
        print(f"| {lib} | {wall(f'import {lib}', a.repeats):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
