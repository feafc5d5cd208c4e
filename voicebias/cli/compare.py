"""`voicebias compare RUN_A RUN_B`: what changed between the audit cards of two runs.

Each RUN is resolved to an audit card (reports/report/audit_card.json, docs/audit-card.md): a path,
else a git revision of the repository around the working directory, else an MLflow run id (the
pipeline parent run's artifact); a RUN none of these resolves is an error (exit status 2).
`compare_cards(a, b, rtol)` lists the differences, one per changed value, records keyed by system,
numbers equal within the relative tolerance `rtol`. The report goes to stdout by section (`--json`:
a list of {path, old, new}); where each card came from goes to stderr, with a warning for each
system whose model id or system fingerprint differs between the runs (`served_warnings`). Exit
status 0 whether or not the cards differ.

The resolution order, the matching and the report: docs/audit-card.md, "Comparing two audits".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voicebias import config
from voicebias.errors import ConfigError, VoicebiasError
from voicebias.io import read_text

DEFAULT_RTOL = 1e-9
CARD_NAME = "audit_card.json"
#: where the report stage writes the card, relative to the repository root (reports/report/audit_card.json)
CARD_IN_REPO = (config.REPORT_DIR / CARD_NAME).relative_to(config.ROOT).as_posix()
#: the card's artifact path on an MLflow parent run (tracking.log_pipeline_run logs REPORT_FILES under report/)
CARD_ARTIFACT = f"report/{CARD_NAME}"
#: MLflow run ids are uuid4 hex strings
RUN_ID = re.compile(r"[0-9a-f]{32}")
#: the estimate key of an interval record (one that also has ci_low and ci_high)
ESTIMATES = ("odds_ratio", "rate", "est", "delta_pp", "retention")
SEP = "/"


class CardNotFound(ConfigError):
    """A RUN argument that no resolver turned into an audit card; `tried` says why each failed."""

    def __init__(self, run: str, tried: list[tuple[str, str]]):
        self.run, self.tried = run, tried
        lines = [f"cannot resolve '{run}' to an audit card; tried:"]
        lines += [f"  {what}: {why}" for what, why in tried]
        super().__init__("\n".join(lines))


class _Absent:
    """A path one of the two cards does not have."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


@dataclass(frozen=True)
class Difference:
    """One changed value: its path in the keyed card (segments joined by '/'), old and new value
    (ABSENT where that card lacks the path)."""

    path: str
    old: Any
    new: Any

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "old": None if self.old is ABSENT else self.old,
            "new": None if self.new is ABSENT else self.new,
        }


# --- comparing -----------------------------------------------------------------------------------


def _record_key(r: dict[str, Any]) -> tuple[str, ...] | None:
    if isinstance(r.get("system"), str):
        return (r["system"],)
    if isinstance(r.get("voice_gender"), str) and isinstance(r.get("measure"), str):
        return (r["voice_gender"], r["measure"])
    return None


def keyed(value: Any) -> Any:
    """`value` with every list of records that have a system (or a voice gender and a measure) turned
    into a mapping by that key, the key fields dropped; other lists stay lists."""
    if isinstance(value, dict):
        return {k: keyed(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
        keys = [_record_key(r) for r in value]
        if all(k is not None and len(k) == len(keys[0]) for k in keys) and len(set(keys)) == len(keys):
            out: dict[str, Any] = {}
            for k, r in zip(keys, value):
                node = out
                for part in k[:-1]:
                    node = node.setdefault(part, {})
                fields = ("system",) if len(k) == 1 else ("voice_gender", "measure")
                node[k[-1]] = keyed({f: v for f, v in r.items() if f not in fields})
            return out
    if isinstance(value, list):
        return [keyed(v) for v in value]
    return value


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def same(x: Any, y: Any, rtol: float = DEFAULT_RTOL) -> bool:
    """Equal values: numbers within `rtol` of each other (NaN equals NaN), mappings and lists element by element."""
    if _number(x) and _number(y):
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            return True
        return math.isclose(x, y, rel_tol=rtol, abs_tol=0.0)
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(same(x[k], y[k], rtol) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(same(a, b, rtol) for a, b in zip(x, y))
    return type(x) is type(y) and x == y


def _walk(path: tuple[str, ...], x: Any, y: Any, rtol: float, out: list[Difference]) -> None:
    if isinstance(x, dict) and isinstance(y, dict):
        for k in [*x, *(k for k in y if k not in x)]:
            _walk((*path, str(k)), x.get(k, ABSENT), y.get(k, ABSENT), rtol, out)
    elif not same(x, y, rtol):
        out.append(Difference(SEP.join(path), x, y))


def compare_cards(a: dict[str, Any], b: dict[str, Any], rtol: float = DEFAULT_RTOL) -> list[Difference]:
    """The differences from card `a` to card `b`, in `a`'s order (then what only `b` has)."""
    if rtol < 0:
        raise ConfigError(f"rtol must be >= 0, got {rtol}")
    out: list[Difference] = []
    _walk((), keyed(a), keyed(b), rtol, out)
    return out


# --- resolving -----------------------------------------------------------------------------------


def load_card(text: str, source: str) -> dict[str, Any]:
    """The card parsed from `text`; an error naming `source` when it is not an audit card."""
    try:
        card = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{source}: not JSON ({exc})") from exc
    if not isinstance(card, dict) or not isinstance(card.get("s2s"), list):
        raise ConfigError(f"{source}: not an audit card (no 's2s' list)")
    return card


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True)


def repo_root(cwd: Path) -> Path | None:
    """The top folder of the git repository around `cwd`, None outside one."""
    try:
        done = _git(["rev-parse", "--show-toplevel"], cwd)
    except OSError:
        return None
    return Path(done.stdout.decode().strip()) if done.returncode == 0 else None


def _from_path(run: str, cwd: Path) -> tuple[dict[str, Any], str] | str:
    path = Path(run) if Path(run).is_absolute() else cwd / run
    if path.is_file():
        return load_card(read_text(path), str(path)), f"file {path}"
    if path.is_dir():
        for rel in (CARD_NAME, CARD_IN_REPO):
            if (path / rel).is_file():
                card = path / rel
                return load_card(read_text(card), str(card)), f"file {card}"
        return f"folder {path} holds neither {CARD_NAME} nor {CARD_IN_REPO}"
    return f"no file or folder {path}"


def _from_git(run: str, cwd: Path) -> tuple[dict[str, Any], str] | str:
    root = repo_root(cwd)
    if root is None:
        return f"{cwd} is not in a git repository"
    if run.startswith("-"):
        return f"'{run}' is not a revision"
    done = _git(["rev-parse", "--verify", "--quiet", f"{run}^{{commit}}"], root)
    if done.returncode != 0:
        return f"'{run}' is not a revision of {root}"
    commit = done.stdout.decode().strip()
    shown = _git(["show", f"{commit}:{CARD_IN_REPO}"], root)
    if shown.returncode != 0:
        return f"revision {run} ({commit[:12]}) of {root} has no {CARD_IN_REPO}"
    source = f"git revision {run} ({commit[:12]}) of {root}: {CARD_IN_REPO}"
    try:
        text = shown.stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start})") from exc
    return load_card(text, source), source


def store_uri(cwd: Path) -> str:
    """The tracking URI `voicebias.report.tracking.tracking_uri` gives for the repository around `cwd`:
    MLFLOW_TRACKING_URI, else the tracking section of its params.yaml (else profiles/embedded.yaml),
    a relative sqlite path taken from the repository root."""
    from voicebias.cli.measure import active_params
    from voicebias.report.tracking import tracking_uri

    root = repo_root(cwd) or cwd
    # tracking_uri reads the environment first; params are only needed without it
    params = {} if os.environ.get("MLFLOW_TRACKING_URI") else active_params(root)[0]
    return tracking_uri(params, root)


def _missing_store(uri: str) -> str | None:
    """Why a local store named by `uri` is not there (opening it would create an empty one), else None."""
    for prefix in ("sqlite:///", "file://"):
        if uri.startswith(prefix):
            local = Path(uri[len(prefix) :])
            return None if local.exists() else f"no MLflow store at {local}"
    if "://" not in uri and not Path(uri).exists():
        return f"no MLflow store at {uri}"
    return None


def _from_mlflow(run: str, cwd: Path) -> tuple[dict[str, Any], str] | str:
    if not RUN_ID.fullmatch(run):
        return f"'{run}' is not an MLflow run id (32 hex digits)"
    try:
        uri = store_uri(cwd)
    except (VoicebiasError, FileNotFoundError) as exc:
        return f"no tracking URI: {exc}"
    missing = _missing_store(uri)
    if missing:
        return missing
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)  # no global mlflow.set_tracking_uri: it would leak into the environment
    try:
        client.get_run(run)
    except MlflowException as exc:
        return f"no run {run} in {uri} ({exc.message})"
    with tempfile.TemporaryDirectory(prefix="voicebias-compare-") as tmp:
        try:
            local = client.download_artifacts(run, CARD_ARTIFACT, tmp)
        except (MlflowException, OSError) as exc:
            return f"run {run} in {uri} has no artifact {CARD_ARTIFACT} ({exc})"
        source = f"MLflow run {run} in {uri}: {CARD_ARTIFACT}"
        return load_card(read_text(Path(local)), source), source


RESOLVERS = (("path", _from_path), ("git revision", _from_git), ("MLflow run id", _from_mlflow))


def resolve_card(run: str, cwd: Path | None = None) -> tuple[dict[str, Any], str]:
    """(card, where it came from) for a RUN argument, trying a path, a git revision, then an MLflow run id.

    Raises CardNotFound, naming why each failed, when none resolves; ConfigError when the
    one that resolves is not an audit card.
    """
    cwd = Path(cwd) if cwd else Path.cwd()
    tried = []
    for what, resolver in RESOLVERS:
        got = resolver(run, cwd)
        if not isinstance(got, str):
            return got
        tried.append((what, got))
    raise CardNotFound(run, tried)


# --- the report ----------------------------------------------------------------------------------

SECTIONS = {
    "s2s": "speech-to-speech systems",
    "sc": "continuation systems",
    "checks": "checks",
    "exclusions": "exclusions",
    "planted_vs_recovered": "planted vs recovered",
    "provenance": "provenance",
    "rules": "rules",
}
#: readable names of a system's entries (path below the system); others are their keys joined by spaces
LABELS = {
    ("invariance", "verdict"): "invariance",
    ("invariance",): "OR per content step",
    ("invariance", "source"): "OR source",
    ("invariance", "fit_status"): "describe fit status",
    ("invariance", "n"): "describe n",
    ("invariance", "n_excluded"): "describe n excluded",
    ("misgender", "misaligned"): "misgender rate misaligned",
    ("misgender", "aligned"): "misgender rate aligned",
    ("misgender", "difference_pp"): "misgender misaligned - aligned (pp)",
    ("summarize",): "summarize delta pp",
    ("drift", "verdict"): "RQ1 drift",
}


def _node(card: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(card, dict) or part not in card:
            return ABSENT
        card = card[part]
    return card


def _estimate_key(node: Any) -> str | None:
    """The estimate key of an interval record (estimate, ci_low, ci_high), else None."""
    if isinstance(node, dict) and "ci_low" in node and "ci_high" in node:
        return next((k for k in ESTIMATES if k in node), None)
    return None


def _g(v: Any, digits: int) -> str:
    if v is ABSENT:
        return "absent"
    if v is None:
        return "none"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    if isinstance(v, list):
        return "[" + ", ".join(_g(x, digits) for x in v) + "]"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_g(x, digits)}" for k, x in v.items() if not isinstance(x, (dict, list)))
    return str(v)


def _digits(pairs: list[tuple[Any, Any]]) -> int:
    """The fewest significant digits (at least 4) that show each changed pair of numbers as two strings."""
    nums = [(o, n) for o, n in pairs if isinstance(o, float) or isinstance(n, float)]
    for d in range(4, 18):
        if all(_g(o, d) != _g(n, d) for o, n in nums):
            return d
    return 17


def _interval(node: Any, key: str, digits: int) -> str:
    if not isinstance(node, dict):
        return _g(node, digits)
    return f"{_g(node.get(key), digits)} [{_g(node.get('ci_low'), digits)}, {_g(node.get('ci_high'), digits)}]"


def _summary(section: str, entry: Any) -> str:
    if section == "s2s" and isinstance(entry, dict):
        inv, drift = entry.get("invariance") or {}, entry.get("drift") or {}
        return (
            f"invariance {_g(inv.get('verdict'), 4)}, OR per content step {_interval(inv, 'odds_ratio', 4)}, "
            f"RQ1 drift {_g(drift.get('verdict'), 4)}"
        )
    if section == "sc" and isinstance(entry, dict):
        return f"{len(_leaves(entry.get('retention') or {}))} retention estimates"
    return _g(entry, 4)


def _leaves(d: dict[str, Any]) -> list[Any]:
    return [x for v in d.values() for x in (_leaves(v) if isinstance(v, dict) and _estimate_key(v) is None else [v])]


def _line(section: str, rest: tuple[str, ...], old: Any, new: Any, text: str | None = None) -> str:
    """One line: `<system>: <label> <old -> new>` in the system sections, `<path>: <old -> new>` elsewhere."""
    if text is None:
        key = _estimate_key(old) or _estimate_key(new)
        if old is ABSENT or new is ABSENT:
            text = f"added ({_summary(section, new)})" if old is ABSENT else f"removed (was {_summary(section, old)})"
        elif key:
            text = f"{_interval(old, key, 4)} -> {_interval(new, key, 4)}"
        else:
            d = _digits([(old, new)]) if _number(old) and _number(new) else 4
            text = f"{_g(old, d)} -> {_g(new, d)}"
    if section in ("s2s", "sc") and rest:
        label = LABELS.get(rest[1:], " ".join(rest[1:]))
        return f"{rest[0]}: {label + ' ' if label else ''}{text}"
    return f"{' '.join(rest or (section,))}: {text}"


def format_differences(diffs: list[Difference], a: dict[str, Any], b: dict[str, Any]) -> str:
    """The plain-text report of `diffs` (from compare_cards(a, b)): one block per section, an estimate
    and its CI on one line; `no differences` when there are none."""
    if not diffs:
        return "no differences"
    ka, kb = keyed(a), keyed(b)
    blocks: dict[str, list[str]] = {}
    grouped: dict[tuple[str, ...], list[Difference]] = {}
    order: list[tuple[tuple[str, ...], Difference | None]] = []
    for d in diffs:
        path = tuple(d.path.split(SEP))
        parent = path[:-1]
        key = _estimate_key(_node(ka, parent)) or _estimate_key(_node(kb, parent))
        if key and path[-1] in (key, "ci_low", "ci_high") and len(parent) > 1:
            if parent not in grouped:
                grouped[parent] = []
                order.append((parent, None))
            grouped[parent].append(d)
        else:
            order.append((path, d))
    # a system's (a check's, ...) lines together, in the card's order, its verdicts first
    first: dict[tuple[str, ...], int] = {}
    for path, _ in order:
        first.setdefault(path[:2], len(first))
    order.sort(key=lambda item: (first[item[0][:2]], item[0][-1] != "verdict"))
    for path, d in order:
        # a key the card format does not have (yet) is listed under 'other' with its whole path
        section, rest = (path[0], path[1:]) if path[0] in SECTIONS else ("other", path)
        if d is None:  # an estimate with its CI
            old, new = _node(ka, path), _node(kb, path)
            key = _estimate_key(old) or _estimate_key(new)
            digits = _digits([(x.old, x.new) for x in grouped[path]])
            line = _line(section, rest, old, new, f"{_interval(old, key, digits)} -> {_interval(new, key, digits)}")
        else:
            line = _line(section, rest, d.old, d.new)
        blocks.setdefault(SECTIONS.get(section, "other"), []).append(line)
    names = [*SECTIONS.values(), "other"]
    return "\n\n".join(f"== {name}\n" + "\n".join(f"  {x}" for x in blocks[name]) for name in names if name in blocks)


def cmd_compare(args: argparse.Namespace) -> int:
    try:
        (a, source_a), (b, source_b) = resolve_card(args.run_a), resolve_card(args.run_b)
    except CardNotFound as exc:
        print(f"voicebias compare: {exc}", file=sys.stderr)
        return 2
    print(f"voicebias compare: A is {source_a}\nvoicebias compare: B is {source_b}", file=sys.stderr)
    for line in served_warnings(a, b):
        print(f"voicebias compare: warning: {line}", file=sys.stderr)
    diffs = compare_cards(a, b, args.rtol)
    if args.json:
        print(json.dumps([d.to_json() for d in diffs], indent=2, ensure_ascii=False))
    else:
        print(format_differences(diffs, a, b))
    return 0


def served_warnings(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """One line per system the two cards say was answered by different models: a model id or a
    system fingerprint (the `usage` entries, docs/cost.md) in one run and not the other. An API
    model behind one name changes; a difference between two such runs may be the model's."""

    def served(card: dict[str, Any]) -> dict[str, tuple[set[str], set[str]]]:
        out = {}
        for u in card.get("usage") or []:
            ids = {x.strip() for x in (u.get("model_ids") or "").split(";") if x.strip()}
            fps = {x.strip() for x in (u.get("fingerprints") or "").split(";") if x.strip()}
            out[u["system"]] = (ids, fps)
        return out

    sa, sb = served(a), served(b)
    lines = []
    for system in sorted(set(sa) & set(sb)):
        for i, what in enumerate(("model id", "system fingerprint")):
            old, new = sa[system][i], sb[system][i]
            if old and new and old != new:
                lines.append(
                    f"{system} was answered by {what}(s) {', '.join(sorted(old))} in A and "
                    f"{', '.join(sorted(new))} in B: the model behind the name may have changed, and a "
                    "difference below may be the model's rather than the audit's"
                )
    return lines


def _rtol(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `compare` on the command's subparsers."""
    p = sub.add_parser("compare", help="what changed between the audit cards of two runs")
    for name in ("run_a", "run_b"):
        p.add_argument(
            name,
            metavar=name.upper(),
            help="an audit_card.json, a folder holding one (or "
            "reports/report/audit_card.json), a git revision, or an MLflow run id",
        )
    p.add_argument(
        "--rtol",
        type=_rtol,
        default=DEFAULT_RTOL,
        help=f"numbers within this relative tolerance are equal (default {DEFAULT_RTOL:g})",
    )
    p.add_argument("--json", action="store_true", help="print the differences as a JSON list of {path, old, new}")
    p.set_defaults(fn=cmd_compare)
