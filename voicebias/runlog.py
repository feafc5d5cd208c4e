"""The run log: wall-clock facts of each stage run, kept out of every hashed output.

Call counts, cache hits, retries of this particular run and wall time differ between
two runs that produce the same evidence, so they never go into DVC-tracked outputs or
git-tracked metrics. Each stage appends one JSON line to `logs/runs.jsonl` (untracked);
the tracking stage attaches the latest entry of every stage to the MLflow parent run.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from voicebias.config import RUN_LOG
from voicebias.io import _clean

#: counts a runner reports that depend on this run (cache state, retries, timing), not on the evidence
RUN_FACTS = ("calls", "attempts", "cache_hits", "corrupt", "asr_calls", "wall_s")


def split_counts(counts: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(facts of the outputs, facts of this run): the first may be tracked, the second goes to the run log."""
    tracked = {k: v for k, v in counts.items() if k not in RUN_FACTS}
    return tracked, {k: counts[k] for k in RUN_FACTS if k in counts}


def record(stage: str, facts: dict[str, Any], path: Path | None = None) -> None:
    """Append one entry for `stage` (UTC timestamp, process id, the facts)."""
    path = Path(path or RUN_LOG)
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {
        "stage": stage,
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "pid": os.getpid(),
        **_clean(facts),
    }
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, sort_keys=True, ensure_ascii=False) + "\n")


def latest(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The newest entry per stage (empty when nothing was logged here, e.g. a fresh `dvc pull`)."""
    path = Path(path or RUN_LOG)
    out: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a killed process
        if isinstance(entry, dict) and "stage" in entry:
            out[str(entry["stage"])] = entry
    return out
