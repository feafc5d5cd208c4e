"""The measurement cache: each component of the measure set is measured once per audio.

Every stage that measures audio goes through voicebias.instruments.acoustics.measure_files, which
keeps its results here: one entry per component of one file, keyed by the file's sha256, the part
and sample rate read, the settings and code of the component and of those it builds on, and the
code paths of the numerical libraries, so a changed setting or module re-measures that component
alone. Entries are JSON files under `<cache_dir>/components/`; one that is malformed is a miss. The
cache is not a DVC output: deleting it costs time, never results.

The key, the entry shapes and what re-measures: docs/instrument.md, "The measurement cache".
"""

from __future__ import annotations

import hashlib
import math
import os
from concurrent.futures import ProcessPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

from voicebias import codepaths
from voicebias.cache import JsonCache, content_key
from voicebias.errors import ConfigError

#: the parts of a file that can be measured: all of it, or either half of the signal as read
PARTS = ("whole", "first_half", "second_half")


@lru_cache(maxsize=4)
def component_code(instrument: Any) -> dict[str, str]:
    """sha256 (hex) of the code of each component and of the reader: the whole text of the
    source files `instrument.component_sources()` gives (each component's module and the
    instrument modules it imports), with the parselmouth and Praat versions. `instrument` is
    the module that defines the measure set (voicebias.instruments.acoustics), passed in so
    this module never imports it."""
    import parselmouth

    out = {}
    for name, files in instrument.component_sources().items():
        h = hashlib.sha256(f"parselmouth {parselmouth.VERSION} praat {parselmouth.PRAAT_VERSION}\n".encode())
        for f in files:
            h.update(f"{Path(f).name}\n".encode())
            h.update(Path(f).read_bytes())
        out[name] = h.hexdigest()
    return out


def _lineage(component: str, instrument: Any) -> tuple[str, ...]:
    return (*instrument.COMPONENTS[component].inputs, component)


def read_key(sha256: str, part: str, sample_rate: int, settings: Any, instrument: Any) -> str:
    """Key of what reading the file gave (duration, notes) under these audio checks."""
    checks = settings.checks()
    return content_key(
        {
            "entry": "read",
            "sha256": sha256,
            "part": part,
            "sample_rate": int(sample_rate),
            "checks": checks.__dict__,
            "code": component_code(instrument)["read"],
        }
    )


def component_key(component: str, sha256: str, part: str, sample_rate: int, settings: Any, instrument: Any) -> str:
    """Key of one component of one file: audio, part, rate, the settings and code of the
    component and of the components it builds on."""
    code = component_code(instrument)
    lineage = _lineage(component, instrument)
    return content_key(
        {
            "entry": component,
            "sha256": sha256,
            "part": part,
            "sample_rate": int(sample_rate),
            "settings": {f: getattr(settings, f) for c in lineage for f in instrument.COMPONENTS[c].settings},
            "code": {c: code[c] for c in ("read", *lineage)},
            "code_paths": codepaths.identity(),
        }
    )


def _is_float(v: Any, nan_ok: bool = False) -> bool:
    return isinstance(v, float) and (math.isfinite(v) or (nan_ok and math.isnan(v)))


def valid_read(value: Any) -> bool:
    """Whether `value` has the shape of a read entry: {duration_s: float >= 0 (s), note: str}."""
    return (
        isinstance(value, dict)
        and set(value) == {"duration_s", "note"}
        and _is_float(value["duration_s"])
        and value["duration_s"] >= 0
        and isinstance(value["note"], str)
    )


def valid_component(value: Any, component: str, instrument: Any) -> bool:
    """Whether `value` has the shape of an entry of `component`: its measures as floats
    (finite; NaN only for a voice-quality measure and F4), or an exclusion [code, message]."""
    from voicebias.contract import OPTIONAL_FORMANT_MEASURES, VOICE_QUALITY_MEASURES

    optional = {*VOICE_QUALITY_MEASURES, *OPTIONAL_FORMANT_MEASURES}

    if not isinstance(value, dict):
        return False
    if set(value) == {"excluded"}:
        ex = value["excluded"]
        return isinstance(ex, list) and len(ex) == 2 and all(isinstance(t, str) for t in ex) and bool(ex[0])
    if set(value) != {"values"} or not isinstance(value["values"], dict):
        return False
    values = value["values"]
    return set(values) == set(instrument.COMPONENTS[component].measures) and all(
        _is_float(v, nan_ok=k in optional) for k, v in values.items()
    )


class MeasureCache:
    """Component entries under `<root>/components/`, with hit, miss and corrupt counts
    (`corrupt`: entries that are not JSON or not of their kind's shape, measured again)."""

    def __init__(self, root: Path | str):
        self.store = JsonCache(Path(root) / "components", shard=2, check=lambda v: isinstance(v, dict))
        self.malformed = 0

    @property
    def corrupt(self) -> int:
        return self.store.corrupt + self.malformed

    def get(self, key: str, check: Any = None) -> dict[str, Any] | None:
        """The entry under `key`, or None when there is none or it fails `check(value)`."""
        value = self.store.get(key)
        if value is not None and check is not None and not check(value):
            self.malformed += 1
            return None
        return value

    def put(self, key: str, value: dict[str, Any]) -> None:
        self.store.put(key, value)


def _work(job: tuple[Any, str, Any, int, str, tuple[str, ...]]) -> dict[str, Any]:
    """Worker: read one part of one file and measure the components asked for with the
    instrument's `measure_components`. A refusal (AudioError) is returned with its code;
    any other error is returned as `measure_error` with its text, so one file never ends
    the batch (in a process pool an exception would end pool.map for every file)."""
    from voicebias.audio import AudioError, read_part

    measure_components, path, settings, sample_rate, part, components = job
    if os.path.isdir(path):  # not "missing": there is something at the path, but no file
        return {"refused": ["not_audio", f"{path}: a folder, not an audio file"]}
    try:
        x, sr, read = read_part(path, settings, sample_rate, part)
        measured = measure_components(x, sr, settings, components)
    except AudioError as exc:  # unreadable, or the signal cannot be analysed at all (sample rate, too short)
        return {"refused": [exc.code, str(exc)]}
    except Exception as exc:  # noqa: BLE001 - this file's row, never the batch's end
        text = " ".join(str(exc).split())  # Praat's messages span lines
        return {
            "refused": [
                "measure_error",
                f"{path}: {type(exc).__name__}: {text}" if text else f"{path}: {type(exc).__name__}",
            ]
        }
    return {"read": read, "components": measured}


def _row(
    key: str,
    read: dict[str, Any] | None,
    refused: list[str] | None,
    recs: dict[str, dict[str, Any]],
    order: tuple[str, ...],
) -> dict[str, Any]:
    from voicebias.contract import MEASURE_COLUMNS

    if refused is not None:
        return {"id": key, "status": "excluded", "reason": refused[0], "error": refused[1], "note": ""}
    row: dict[str, Any] = {
        "id": key,
        "status": "ok",
        "reason": "",
        "error": "",
        "note": read["note"],
        "duration_s": read["duration_s"],
    }
    for c in order:
        rec = recs[c]
        if "excluded" in rec:
            return {
                "id": key,
                "status": "excluded",
                "reason": rec["excluded"][0],
                "error": rec["excluded"][1],
                "note": "",
            }
        row.update(rec["values"])
    return {**row, **{c: row.get(c, float("nan")) for c in MEASURE_COLUMNS}}


def measure_jobs(
    jobs: list[tuple],
    sample_rate: int,
    workers: int,
    desc: str,
    cache: MeasureCache | None,
    components: tuple[str, ...] | list[str] | None,
    instrument: Any,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (in job order) and counts for measure_files (see its docstring); `instrument`
    is the module that defines the measure set (COMPONENTS, components_for,
    check_settings, measure_components)."""
    from tqdm import tqdm

    from voicebias.audio import sha256_file

    COMPONENTS, check_settings, components_for = (
        instrument.COMPONENTS,
        instrument.check_settings,
        instrument.components_for,
    )

    plans = []
    for job in jobs:
        key, path, settings, *rest = job
        part = rest[0] if rest else "whole"
        if part not in PARTS:
            raise ConfigError(f"measure part must be one of {', '.join(PARTS)}, not '{part}'")
        check_settings(settings)
        order = components_for(settings, components)
        plan = {
            "id": key,
            "path": str(path),
            "settings": settings,
            "part": part,
            "order": order,
            "read": None,
            "recs": {},
            "need": list(order),
            "sha": None,
        }
        if cache is not None and os.path.isfile(path):
            sha = plan["sha"] = sha256_file(path)
            plan["read"] = cache.get(read_key(sha, part, sample_rate, settings, instrument), valid_read)
            need = []
            for c in order:
                rec = cache.get(
                    component_key(c, sha, part, sample_rate, settings, instrument),
                    lambda v, c=c: valid_component(v, c, instrument),
                )
                if rec is None:
                    need.append(c)
                    continue
                plan["recs"][c] = rec
                if "excluded" in rec:
                    break
            # components after a cached exclusion are not measured; a read must happen if
            # anything is measured, or if the read itself is not cached
            if any("excluded" in r for r in plan["recs"].values()):
                cut = next(i for i, c in enumerate(order) if "excluded" in plan["recs"].get(c, {}))
                need = [c for c in need if order.index(c) < cut]
            plan["need"] = need
        plans.append(plan)

    # one unit of work per distinct (audio, part, settings, components); largest files first
    work: dict[Any, dict[str, Any]] = {}
    for i, p in enumerate(plans):
        if p["read"] is not None and not p["need"]:
            continue
        ident = (p["sha"], p["part"], p["settings"], tuple(p["need"])) if p["sha"] else ("job", i)
        work.setdefault(
            ident,
            {
                "job": (
                    instrument.measure_components,
                    p["path"],
                    p["settings"],
                    sample_rate,
                    p["part"],
                    tuple(p["need"]),
                ),
                "plans": [],
                "size": os.path.getsize(p["path"]) if os.path.isfile(p["path"]) else 0,
            },
        )
        work[ident]["plans"].append(i)
    units = sorted(work.values(), key=lambda u: -u["size"])
    jobs_to_run = [u["job"] for u in units]
    if workers <= 1 or len(jobs_to_run) < 4:
        results = [_work(j) for j in tqdm(jobs_to_run, desc=desc)]
    else:
        from voicebias.parallel import one_thread_per_worker

        with ProcessPoolExecutor(max_workers=min(workers, len(jobs_to_run)), initializer=one_thread_per_worker) as pool:
            results = list(tqdm(pool.map(_work, jobs_to_run, chunksize=1), total=len(jobs_to_run), desc=desc))

    counts = {
        "files": len(plans),
        "measured": {c: 0 for c in COMPONENTS},
        "cached": {c: 0 for c in COMPONENTS},
        "refused": 0,
        "corrupt": cache.corrupt if cache is not None else 0,
    }
    refused: dict[int, list[str]] = {}
    fresh: set[tuple[int, str]] = set()
    for unit, result in zip(units, results):
        first = plans[unit["plans"][0]]
        if "refused" in result:
            for i in unit["plans"]:
                refused[i] = result["refused"]
            continue
        if cache is not None and first["sha"]:
            cache.put(read_key(first["sha"], first["part"], sample_rate, first["settings"], instrument), result["read"])
        for c, rec in result["components"].items():
            if cache is not None and first["sha"]:
                cache.put(
                    component_key(c, first["sha"], first["part"], sample_rate, first["settings"], instrument), rec
                )
            fresh.add((unit["plans"][0], c))
        for i in unit["plans"]:
            plans[i]["read"] = result["read"]
            plans[i]["recs"].update(result["components"])

    rows = []
    for i, p in enumerate(plans):
        if i in refused:
            counts["refused"] += 1
        else:
            for c in p["order"]:
                if c in p["recs"]:
                    counts["measured" if (i, c) in fresh else "cached"][c] += 1
        rows.append(_row(p["id"], p["read"], refused.get(i), p["recs"], p["order"]))
    return rows, counts
