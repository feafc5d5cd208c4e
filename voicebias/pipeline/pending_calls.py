"""Stage 'pending_calls': which systems have calls that failed in their last run, so that the next
`dvc repro` calls them again without `-f`.

The runner keeps, per system, an untracked ledger of the calls that failed in its last run
(``<cache>/failed/<system>.json``, :func:`update_ledger`). This stage runs on every `dvc repro`
(``always_changed: true``) and writes ``reports/pending_calls/<system>.json`` with the failed calls
and a round counter, on which respond@SYSTEM and sc_continue@SYSTEM depend: while calls stay failed
the round changes and that system's stage runs again. It imports nothing heavy (no pandas).

The ledger, the file and the rounds: docs/systems.md, "Calls that failed are called again".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from voicebias.cache import atomic_write_bytes, atomic_write_json

#: folder of the ledgers, inside the response cache folder
LEDGER_DIR = "failed"


def ledger_path(cache_dir: Path, system: str) -> Path:
    """Where `system`'s ledger of failed calls lies: <cache_dir>/failed/<system>.json."""
    return Path(cache_dir) / LEDGER_DIR / f"{system}.json"


def read_ledger(cache_dir: Path, system: str) -> dict[str, Any] | None:
    """`system`'s ledger ({"round": r, "tasks": {task: [cache keys]}}), or None when there is none.

    A ledger that cannot be read (not JSON, wrong shape) counts as none: the next run of the
    system writes it afresh."""
    path = ledger_path(cache_dir, system)
    try:
        ledger = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        print(f"pending_calls: the ledger {path} cannot be read; taken as empty", file=sys.stderr)
        return None
    tasks = ledger.get("tasks") if isinstance(ledger, dict) else None
    rnd = ledger.get("round") if isinstance(ledger, dict) else None
    if (
        not isinstance(tasks, dict)
        or not all(isinstance(v, list) for v in tasks.values())
        or isinstance(rnd, bool)
        or not isinstance(rnd, int)
        or rnd < 1
    ):
        print(f"pending_calls: the ledger {path} does not hold {{round, tasks}}; taken as empty", file=sys.stderr)
        return None
    return {"round": rnd, "tasks": tasks}


def update_ledger(cache_dir: Path, system: str, failed: Mapping[str, Iterable[str]]) -> dict[str, Any] | None:
    """Record the calls of `system` that failed in the run that just ended, {task: cache keys}.

    With some failed, the ledger holds them under the next round (the previous round + 1);
    with none, the ledger is removed. Returns the ledger written, or None."""
    tasks = {task: sorted(set(keys)) for task, keys in failed.items()}
    tasks = {task: keys for task, keys in sorted(tasks.items()) if keys}
    path = ledger_path(cache_dir, system)
    if not tasks:
        path.unlink(missing_ok=True)
        return None
    previous = read_ledger(cache_dir, system)
    ledger = {"round": (previous["round"] if previous else 0) + 1, "system": system, "tasks": tasks}
    atomic_write_json(path, ledger, indent=1)
    return ledger


def pending(cache_dir: Path, system: str) -> dict[str, Any]:
    """The tracked record of `system`: {"failed_calls", "round", "system"}, zeros when nothing is pending."""
    ledger = read_ledger(cache_dir, system)
    if ledger is None:
        return {"failed_calls": 0, "round": 0, "system": system}
    return {
        "failed_calls": sum(len(keys) for keys in ledger["tasks"].values()),
        "round": ledger["round"],
        "system": system,
    }


def run_stage(*, systems: Iterable[str], cache_dir: Path, out_dir: Path) -> dict[str, dict[str, Any]]:
    """Write out_dir/<system>.json for every system in `systems` (run.systems then run.sc_systems)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records: dict[str, dict[str, Any]] = {}
    for system in dict.fromkeys(systems):
        record = pending(cache_dir, system)
        text = json.dumps(record, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        path = out_dir / f"{system}.json"
        if not path.exists() or path.read_bytes() != text.encode("utf-8"):
            atomic_write_bytes(path, text.encode("utf-8"))
        if record["failed_calls"]:
            print(
                f"pending_calls: {system} has {record['failed_calls']} failed call(s) from its last run "
                f"(round {record['round']}): its stage runs again",
                file=sys.stderr,
            )
        records[system] = record
    return records
