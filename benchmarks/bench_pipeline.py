"""Benchmark: README command 1 (`dvc repro` on the embedded default) from a fresh clone, stage by stage.

Clones the repository into a new folder, installs it into a new virtual environment the
way the README does (timed apart; `--venv DIR` reuses an installed one instead), then runs
README command 1, one `dvc repro`, and records per stage its wall time (from the moment
DVC starts it to the moment it starts the next one, so DVC's own work between stages is
counted with the stage before), the CPU time of its processes (user + system, read from
DVC's process tree as each stage ends) and its share of the pipeline's wall time.
`--stage-by-stage` runs each stage as its own `dvc repro --single-item` instead (one DVC
start-up per stage more).

Options for a scaling run: `--set KEY=VALUE` (repeatable) writes a params.yaml value in the
clone before the run (YAML values: `--set sc_stimuli.prompts_per_category=null`), and
`--target STAGE` runs only what that stage needs (`--target sc_analysis`: the SC chain);
`--force` runs every stage of it, also those a fresh clone skips because their committed
outputs come out unchanged (so runs of different sizes run the same stages).
Each run starts with an empty cache (VOICEBIAS_CACHE in the clone), so nothing is reused.

Usage: python benchmarks/bench_pipeline.py [--repo .] [--workdir DIR] [--keep] [--json out.json]
       python benchmarks/bench_pipeline.py --venv .venv --target sc_analysis --set sc_stimuli.prompts_per_category=null
       python benchmarks/bench_pipeline.py --in-place   # the current checkout, every stage forced
Prints a markdown table and writes the JSON when asked.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGE_LINE = re.compile(r"Running stage '([^']+)'")  # anywhere: a progress bar's \r may precede it


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed(cmd: list[str], cwd: Path, env: dict[str, str], log) -> tuple[float, float, int]:
    """(wall s, CPU s of the command's process tree, exit code)."""
    cpu0, t0 = _children_cpu_s(), time.perf_counter()
    rc = subprocess.call(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    return time.perf_counter() - t0, _children_cpu_s() - cpu0, rc


def stage_order(clone: Path, env: dict[str, str], force: bool, target: str | None = None) -> list[str]:
    """The stages `dvc repro` would run, in its order."""
    cmd = ["dvc", "repro", "--dry", *(["--force"] if force else []), *([target] if target else [])]
    out = subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True, check=True).stdout
    return [m.group(1) for line in out.splitlines() if (m := STAGE_LINE.search(line))]


def install(clone: Path, log) -> tuple[float, dict[str, str]]:
    """README's install into clone/.venv; (wall s, the environment with the venv first on PATH)."""
    t0 = time.perf_counter()
    venv = clone / ".venv"
    subprocess.check_call([sys.executable, "-m", "venv", str(venv)], stdout=log, stderr=subprocess.STDOUT)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.check_call([*pip, "-c", "requirements.lock", "-e", "."], cwd=clone, stdout=log, stderr=subprocess.STDOUT)
    subprocess.check_call(
        [*pip, "--no-deps", "-r", "requirements-nodeps.txt"], cwd=clone, stdout=log, stderr=subprocess.STDOUT
    )
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    return time.perf_counter() - t0, env


def _tree_cpu_s(proc) -> float:
    """CPU seconds (user + system) of a process and of its children it has waited for."""
    t = proc.cpu_times()
    return t.user + t.system + t.children_user + t.children_system


def run(
    clone: Path, env: dict[str, str], force: bool, log, target: str | None = None, stage_by_stage: bool = False
) -> dict:
    import psutil

    cores = os.cpu_count() or 1
    dvc_wall, dvc_cpu, _ = timed(["dvc", "repro", "--dry", *([target] if target else [])], clone, env, log)
    rows = []
    if stage_by_stage:
        for stage in stage_order(clone, env, force, target):
            wall, cpu, rc = timed(
                ["dvc", "repro", "--single-item", *(["--force"] if force else []), stage], clone, env, log
            )
            if rc != 0:
                raise SystemExit(f"stage {stage} failed (exit {rc}); see the log")
            rows.append({"stage": stage, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2)})
    else:
        cmd = ["dvc", "repro", *(["--force"] if force else []), *([target] if target else [])]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ps = psutil.Process(proc.pid)
        current, started, cpu_at = None, t0, 0.0
        for line in proc.stdout:
            log.write(line)
            m = STAGE_LINE.search(line)
            if not m:
                continue
            now, cpu = time.perf_counter(), _tree_cpu_s(ps)
            if current is not None:
                rows.append({"stage": current, "wall_s": round(now - started, 2), "cpu_s": round(cpu - cpu_at, 2)})
            current, started, cpu_at = m.group(1), now, cpu
        cpu = _tree_cpu_s(ps)
        rc = proc.wait()
        now = time.perf_counter()
        if current is not None:
            rows.append({"stage": current, "wall_s": round(now - started, 2), "cpu_s": round(cpu - cpu_at, 2)})
        if rc != 0:  # the stages up to the failure are still timed: print them, then fail
            print(f"dvc repro failed (exit {rc}) in stage {current}; the table ends with it; see the log below")
    total = sum(r["wall_s"] for r in rows)
    for r in rows:
        r["cpu_use_pct"] = round(100 * r["cpu_s"] / r["wall_s"], 1) if r["wall_s"] else 0.0  # of one core
        r["share_pct"] = round(100 * r["wall_s"] / total, 1) if total else 0.0
    return {
        "cores": cores,
        "stages": rows,
        "pipeline_wall_s": round(total, 1),
        "failed": rc != 0 if not stage_by_stage else False,
        "pipeline_cpu_s": round(sum(r["cpu_s"] for r in rows), 1),
        "dvc_startup_s": round(dvc_wall, 2),
        "dvc_startup_cpu_s": round(dvc_cpu, 2),
    }


def set_params(clone: Path, settings: list[str]) -> None:
    """Write KEY=VALUE (dotted key, YAML value) into the clone's params.yaml."""
    import yaml

    path = clone / "params.yaml"
    params = yaml.safe_load(path.read_text(encoding="utf-8"))
    for item in settings:
        key, _, value = item.partition("=")
        node = params
        *parents, last = key.split(".")
        for k in parents:
            node = node[k]
        if last not in node:
            raise SystemExit(f"--set {item}: params.yaml has no key {key}")
        node[last] = yaml.safe_load(value)
    path.write_text(yaml.safe_dump(params, sort_keys=False, allow_unicode=True), encoding="utf-8")


def table(result: dict) -> str:
    lines = ["| stage | wall (s) | CPU (s) | CPU use (% of one core) | share of total |", "|---|---|---|---|---|"]
    for r in sorted(result["stages"], key=lambda r: -r["wall_s"]):
        lines.append(
            f"| {r['stage']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['cpu_use_pct']:.0f} | {r['share_pct']:.1f} % |"
        )
    lines.append(
        f"| **pipeline** | **{result['pipeline_wall_s']:.1f}** | {result['pipeline_cpu_s']:.1f} | "
        f"{100 * result['pipeline_cpu_s'] / max(result['pipeline_wall_s'], 1e-9):.0f} | 100 % |"
    )
    lines.append(
        f"| dvc start-up (one `dvc repro --dry`) | {result['dvc_startup_s']:.1f} | "
        f"{result['dvc_startup_cpu_s']:.1f} | | |"
    )
    head = f"{result['cores']} cores"
    if "install_s" in result:
        head += f"; install {result['install_s']:.0f} s (not in the pipeline time)"
    return head + "\n\n" + "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", type=Path, default=ROOT, help="repository to clone (default: this one)")
    ap.add_argument("--workdir", type=Path, help="folder for the clone (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the clone")
    ap.add_argument("--in-place", action="store_true", help="run in the current checkout, every stage forced")
    ap.add_argument("--json", type=Path, help="write the result as JSON here")
    ap.add_argument("--venv", type=Path, help="use this installed virtual environment instead of installing one")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a params.yaml value in the clone")
    ap.add_argument("--target", help="run only what this stage needs")
    ap.add_argument("--stage-by-stage", action="store_true", help="one `dvc repro --single-item` per stage")
    ap.add_argument(
        "--force",
        action="store_true",
        help="run every stage, also those a fresh clone would skip (committed outputs, inputs unchanged)",
    )
    a = ap.parse_args()
    if a.in_place:
        (ROOT / "logs").mkdir(exist_ok=True)
        with open(ROOT / "logs" / "bench_pipeline.log", "w") as log:
            result = run(ROOT, dict(os.environ), force=True, log=log, target=a.target, stage_by_stage=a.stage_by_stage)
    else:
        work = a.workdir or Path(tempfile.mkdtemp(prefix="voicebias-bench-"))
        clone = work / "clone"
        if clone.exists():
            shutil.rmtree(clone)
        subprocess.check_call(["git", "clone", "-q", str(a.repo), str(clone)])
        if a.set:
            set_params(clone, a.set)
        with open(work / "bench_pipeline.log", "w") as log:
            if a.venv:
                venv = a.venv.resolve()
                env = {
                    **os.environ,
                    "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
                    "VIRTUAL_ENV": str(venv),
                }
                # the package is installed editable from another checkout: import this clone's code
                env["PYTHONPATH"] = f"{clone}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
                install_s = None
            else:
                install_s, env = install(clone, log)
            env["VOICEBIAS_CACHE"] = str(work / "cache")
            result = run(clone, env, force=a.force, log=log, target=a.target, stage_by_stage=a.stage_by_stage)
        if install_s is not None:
            result["install_s"] = round(install_s, 1)
        result["settings"] = a.set
        result["target"] = a.target
        if result.get("failed"):
            print(f"the clone and its log are kept in {work} (bench_pipeline.log)")
        elif not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(table(result))
    if a.json:
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if result.get("failed") else 0


if __name__ == "__main__":
    raise SystemExit(main())
