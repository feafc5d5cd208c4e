"""Do this checkout's pipeline outputs agree with a revision's committed ones?

Byte-identical outputs hold on x86-64-v3 machines (voicebias.codepaths). Elsewhere the last bits
differ, and :func:`verify` says whether the *results* are the same: every output the revision's
``dvc.lock`` records is read at that revision and compared with the working tree's, table by
table, numbers within their column's tolerance (:data:`COLUMN_TOLERANCES`,
:data:`DEFAULT_TOLERANCE`, :data:`AUDIO_TOLERANCE`). The verdict is ``identical``, ``same results
within tolerance`` or ``different results``.

What agrees, file by file, and the tolerances: docs/verify.md.
"""

from __future__ import annotations

import fnmatch
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from voicebias.errors import ConfigError


@dataclass(frozen=True)
class Tolerance:
    rel: float
    abs: float

    def agree(self, a: float, b: float) -> bool:
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return abs(a - b) <= self.abs + self.rel * max(abs(a), abs(b))


DEFAULT_TOLERANCE = Tolerance(rel=1e-6, abs=1e-9)
# (pattern on the column or key name, tolerance); the first match wins.
COLUMN_TOLERANCES: list[tuple[str, Tolerance]] = [
    # p-values far in a tail carry few significant digits of the fit
    ("p_value*", Tolerance(rel=1e-4, abs=1e-10)),
    ("*p_adj*", Tolerance(rel=1e-4, abs=1e-10)),
    ("*_p", Tolerance(rel=1e-4, abs=1e-10)),
    # cosine similarities and embeddings: float32 network outputs
    ("*similarity*", Tolerance(rel=1e-5, abs=1e-6)),
    ("*cosine*", Tolerance(rel=1e-5, abs=1e-6)),
    # optimiser-found quantities (variance components, log-likelihoods, bootstrap ends)
    ("*loglik*", Tolerance(rel=1e-6, abs=1e-6)),
    ("*var*", Tolerance(rel=1e-5, abs=1e-9)),
    ("*sd", Tolerance(rel=1e-5, abs=1e-9)),
]
AUDIO_TOLERANCE = Tolerance(rel=0.0, abs=1e-4)
RENDERINGS = {".png", ".svg", ".pdf", ".jpg", ".jpeg"}
AUDIO = {".wav", ".flac", ".ogg", ".mp3"}
TEXT = {".md", ".html", ".txt", ".yaml", ".yml", ".tex"}
NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
INTEGER = re.compile(r"[-+]?\d+")


def tolerance_for(name: str) -> Tolerance:
    for pattern, tol in COLUMN_TOLERANCES:
        if fnmatch.fnmatchcase(str(name).lower(), pattern):
            return tol
    return DEFAULT_TOLERANCE


@dataclass
class Difference:
    path: str
    where: str
    committed: str
    here: str
    size: float = math.inf  # relative size of a numeric difference; inf for any other kind

    def line(self) -> str:
        size = f" (relative {self.size:.2g})" if math.isfinite(self.size) else ""
        return f"{self.path} {self.where}: committed {self.committed} here {self.here}{size}"


@dataclass
class FileResult:
    path: str
    kind: str  # identical | within | different | rendering
    differences: list[Difference] = field(default_factory=list)


@dataclass
class Verdict:
    rev: str
    files: list[FileResult]
    not_committed: list[str] = field(default_factory=list)  # outputs here that the revision holds no copy of

    @property
    def status(self) -> str:
        kinds = {f.kind for f in self.files}
        if "different" in kinds:
            return "different results"
        if "within" in kinds or "rendering" in kinds:
            return "same results within tolerance"
        return "identical"

    @property
    def exit_code(self) -> int:
        return 1 if self.status == "different results" else 0

    def report(self, limit: int = 10) -> str:
        counts = {k: sum(f.kind == k for f in self.files) for k in ("identical", "within", "different", "rendering")}
        head = (
            f"voicebias verify {self.rev}: {self.status} ({len(self.files)} files: {counts['identical']} identical, "
            f"{counts['within']} within tolerance, {counts['different']} different, "
            f"{counts['rendering']} renderings not compared byte for byte)"
        )
        lines = [head]
        if self.not_committed:
            lines.append(f"not committed at {self.rev}, not compared: {', '.join(self.not_committed)}")
        if self.status == "different results":
            diffs = [d for f in self.files if f.kind == "different" for d in f.differences]
            lines.append(f"differences beyond tolerance ({len(diffs)}; first {min(limit, len(diffs))}):")
        else:
            diffs = sorted((d for f in self.files if f.kind == "within" for d in f.differences), key=lambda d: -d.size)
            if diffs:
                lines.append(f"largest differences within tolerance ({len(diffs)} in all):")
        lines += [f"  {d.line()}" for d in diffs[:limit]]
        return "\n".join(lines)


def _number(cell: str) -> float | None:
    cell = cell.strip()
    if cell.lower() in ("nan", "inf", "-inf", "+inf"):
        return float(cell)
    if NUMBER.fullmatch(cell):
        return float(cell)
    return None


def _compare_cells(path: str, where: str, name: str, a: str, b: str) -> Difference | None:
    """None when two cells agree exactly; a Difference (size inf when not numbers or not within tolerance)."""
    if a == b:
        return None
    x, y = _number(a), _number(b)
    if x is None or y is None or (INTEGER.fullmatch(a.strip()) and INTEGER.fullmatch(b.strip())):
        return Difference(path, where, repr(a), repr(b))
    tol = tolerance_for(name)
    scale = max(abs(x), abs(y))
    size = abs(x - y) / scale if scale and math.isfinite(scale) else math.inf
    diff = Difference(path, where, a, b, size)
    if not tol.agree(x, y):
        diff.size = math.inf
    return diff


def _classify(path: str, diffs: list[Difference]) -> FileResult:
    if any(not math.isfinite(d.size) for d in diffs):
        return FileResult(path, "different", [d for d in diffs if not math.isfinite(d.size)])
    return FileResult(path, "within", diffs)


def compare_csv(path: str, committed: bytes, here: bytes) -> FileResult:
    import csv

    old = list(csv.reader(io.StringIO(committed.decode("utf-8"))))
    new = list(csv.reader(io.StringIO(here.decode("utf-8"))))
    if not old or not new or old[0] != new[0]:
        return FileResult(path, "different", [Difference(path, "columns", str(old[:1]), str(new[:1]))])
    if len(old) != len(new):
        return FileResult(path, "different", [Difference(path, "rows", str(len(old) - 1), str(len(new) - 1))])
    header, diffs = old[0], []
    for i, (ra, rb) in enumerate(zip(old[1:], new[1:]), start=1):
        for name, a, b in zip(header, ra, rb):
            d = _compare_cells(path, f"row {i} column {name}", name, a, b)
            if d is not None:
                diffs.append(d)
    return _classify(path, diffs)


def _walk_json(path: str, where: str, key: str, a: Any, b: Any, out: list[Difference]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        if sorted(a) != sorted(b):
            out.append(Difference(path, where or "keys", str(sorted(a)), str(sorted(b))))
            return
        for k in a:
            _walk_json(path, f"{where}.{k}" if where else str(k), str(k), a[k], b[k], out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(Difference(path, f"{where} length", str(len(a)), str(len(b))))
            return
        for i, (x, y) in enumerate(zip(a, b)):
            _walk_json(path, f"{where}[{i}]", key, x, y, out)
    elif (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not isinstance(a, bool)
        and not isinstance(b, bool)
        and not (isinstance(a, int) and isinstance(b, int))
    ):
        d = _compare_cells(path, where, key, repr(float(a)), repr(float(b)))
        if d is not None:
            out.append(d)
    elif a != b or type(a) is not type(b):
        out.append(Difference(path, where or "value", repr(a), repr(b)))


def compare_json(path: str, committed: bytes, here: bytes) -> FileResult:
    diffs: list[Difference] = []
    try:
        a, b = json.loads(committed), json.loads(here)
    except ValueError as err:
        return FileResult(path, "different", [Difference(path, "JSON", "valid", f"unreadable ({err})")])
    _walk_json(path, "", "", a, b, diffs)
    return _classify(path, diffs)


def compare_text(path: str, committed: bytes, here: bytes) -> FileResult:
    """Rendered text: the words exactly, each printed number within one unit of its last digit."""
    a, b = committed.decode("utf-8", "replace"), here.decode("utf-8", "replace")
    if NUMBER.sub("#", a) != NUMBER.sub("#", b):
        la, lb = NUMBER.sub("#", a).splitlines(), NUMBER.sub("#", b).splitlines()
        line = next((i for i, (x, y) in enumerate(zip(la, lb), 1) if x != y), min(len(la), len(lb)) + 1)
        return FileResult(path, "different", [Difference(path, f"line {line} (text)", "", "")])
    diffs = []
    for i, (x, y) in enumerate(zip(NUMBER.findall(a), NUMBER.findall(b)), 1):
        if x == y:
            continue
        fx, fy = float(x), float(y)
        decimals = max(len(s.split(".")[1]) if "." in s and "e" not in s.lower() else 0 for s in (x, y))
        scale = max(abs(fx), abs(fy))
        size = abs(fx - fy) / scale if scale else math.inf
        ok = abs(fx - fy) <= 10.0**-decimals * (1 + 1e-9) or DEFAULT_TOLERANCE.agree(fx, fy)
        diffs.append(Difference(path, f"number {i}", x, y, size if ok else math.inf))
    return _classify(path, diffs)


def compare_audio(path: str, committed: bytes, here: bytes) -> FileResult:
    import numpy as np
    import soundfile as sf

    try:
        xa, ra = sf.read(io.BytesIO(committed), dtype="float64", always_2d=True)
        xb, rb = sf.read(io.BytesIO(here), dtype="float64", always_2d=True)
    except Exception as err:  # noqa: BLE001 - any decoder failure is a difference, named
        return FileResult(path, "different", [Difference(path, "audio", "decodable", f"not decodable ({err})")])
    if ra != rb or xa.shape != xb.shape:
        return FileResult(
            path, "different", [Difference(path, "audio", f"{xa.shape} at {ra} Hz", f"{xb.shape} at {rb} Hz")]
        )
    gap = float(np.max(np.abs(xa - xb))) if xa.size else 0.0
    diff = Difference(
        path, "largest sample difference", "", f"{gap:.3g}", gap if gap <= AUDIO_TOLERANCE.abs else math.inf
    )
    return _classify(path, [diff])


COMPARERS: dict[str, Callable[[str, bytes, bytes], FileResult]] = {
    ".csv": compare_csv,
    ".json": compare_json,
    **{e: compare_text for e in TEXT},
    **{e: compare_audio for e in AUDIO},
}


def compare_file(path: str, committed: bytes | None, here: bytes | None) -> FileResult:
    if committed is None:
        return FileResult(path, "different", [Difference(path, "file", "absent", "present")])
    if here is None:
        return FileResult(path, "different", [Difference(path, "file", "present", "missing")])
    if committed == here:
        return FileResult(path, "identical")
    suffix = Path(path).suffix.lower()
    if suffix in RENDERINGS:
        return FileResult(path, "rendering")
    comparer = COMPARERS.get(suffix)
    if comparer is None:
        return FileResult(path, "different", [Difference(path, "bytes", "", "differ")])
    return comparer(path, committed, here)


def outputs_at(lock_text: str) -> list[str]:
    """Every output path a dvc.lock records, in its order."""
    import yaml

    lock = yaml.safe_load(lock_text) or {}
    paths: list[str] = []
    for stage in (lock.get("stages") or {}).values():
        for out in stage.get("outs") or []:
            if out.get("path") not in paths:
                paths.append(out["path"])
    return paths


def _lock_at(repo: Path, rev: str) -> tuple[Any, str]:
    """(DVC file system at the revision, its dvc.lock text); ConfigError naming what is wrong."""
    from dvc.api import DVCFileSystem

    if not Path(repo).is_dir():
        raise ConfigError(f"cannot read dvc.lock at {rev!r}: {repo} is no folder")
    try:
        fs = DVCFileSystem(str(repo), rev=rev)
        return fs, fs.read_text("dvc.lock")
    except Exception as err:  # noqa: BLE001 - a bad revision or a repository without a lock
        raise ConfigError(f"cannot read dvc.lock at {rev!r} in {repo}: {err}") from None


def _committed_files(fs: Any, lock_text: str, rev: str) -> Iterator[tuple[str, str, bytes | None]]:
    """(output, path, bytes) of every file under every output the revision's dvc.lock records."""
    try:
        from dvc_data.index.index import DataIndexDirError
    except ImportError:  # another dvc-data layout: a missing directory then surfaces as FileNotFoundError
        DataIndexDirError = FileNotFoundError

    def missing(rel: str, err: Exception) -> ConfigError:
        # recorded in dvc.lock, but its bytes are in no cache or remote here
        return ConfigError(
            f"{rev}'s {rel} is in neither this checkout's DVC cache nor its remote ({err}); "
            f"fetch {rev}'s outputs first (`dvc pull`, or `dvc fetch --rev {rev}` for another revision)"
        )

    for out in outputs_at(lock_text):
        try:
            if fs.isdir(out):
                names = sorted(fs.find(out))
            elif fs.exists(out):
                names = [out]
            else:
                yield out, out, None
                continue
        except (FileNotFoundError, DataIndexDirError) as err:
            raise missing(f"{out}/", err) from None
        for name in names:
            rel = name.lstrip("/")
            try:
                data = fs.read_bytes(rel)
            except (FileNotFoundError, DataIndexDirError) as err:
                raise missing(rel, err) from None
            yield out, rel, data


def verify(rev: str = "HEAD", repo: Path = Path("."), progress: bool = True) -> Verdict:
    """Compare every output recorded at ``rev`` with the working tree's."""
    from tqdm import tqdm

    repo = Path(repo).resolve()
    results, seen, dirs, uncommitted = [], set(), set(), []
    fs, lock_text = _lock_at(repo, rev)  # before the progress bar: a revision that cannot be read is one line
    for out, rel, committed in tqdm(
        _committed_files(fs, lock_text, rev), desc="verify", unit="file", disable=not progress
    ):
        seen.add(rel)
        if out != rel:
            dirs.add(out)
        here_path = repo / rel
        here = here_path.read_bytes() if here_path.is_file() else None
        if committed is None:
            # not committed anywhere at that revision (an untracked marker such as the MLflow
            # store's, or a lock entry of a stage that no longer writes it): nothing to compare
            uncommitted.append(rel)
            continue
        results.append(compare_file(rel, committed, here))
    for out in sorted(dirs):  # files an output folder holds here that the revision's does not
        for extra in sorted(p for p in (repo / out).rglob("*") if p.is_file()):
            rel = extra.relative_to(repo).as_posix()
            if rel not in seen:
                results.append(compare_file(rel, None, extra.read_bytes()))
    return Verdict(rev, results, [u for u in uncommitted if (repo / u).exists()])
