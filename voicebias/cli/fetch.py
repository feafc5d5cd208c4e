"""`voicebias fetch [SYSTEM...] [--dest models/weights] [--dry-run]`: the hub weights of open systems.

Each system card may list, under `weights`, the Hugging Face hub repositories its weights come from
(voicebias.cards.validate_weights); without names, the systems of the active profile are fetched,
each to `<dest>/<name of requires.weights>`. Every file of a repository is downloaded at the commit
the hub resolved for it and hashed, a file whose hash differs from the card's is deleted, and
`<dest>/fetched.json` records what was fetched. The token (`HF_TOKEN`) is never printed or written;
a system that fails leaves the others going, with exit status 1, and the files its failed fetch
wrote are removed (what was there before stays). `--dry-run` downloads nothing. `--pin` writes
the commit each repository resolved to and every file's sha256 into the card, so the next fetch
gets and verifies exactly those bytes.

See docs/repository-systems.md, "Fetching weights".
"""

from __future__ import annotations

import argparse
import datetime as _dt
import fnmatch
import hashlib
import json
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from voicebias import config
from voicebias.errors import ConfigError, NotFound, VoicebiasError

DEFAULT_DEST = "models/weights"
MANIFEST = "fetched.json"
DEFAULT_ENDPOINT = "https://huggingface.co"


class FetchFailed(VoicebiasError):
    """One system could not be fetched; the message says why, in plain words."""


@dataclass
class Outcome:
    system: str
    status: str  # ok | failed | skipped | planned
    message: str = ""
    weights: list[dict[str, Any]] = field(default_factory=list)


def endpoint() -> str:
    """The hub the downloads go to: HF_ENDPOINT, read now (huggingface_hub reads it once at import)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _shown_endpoint() -> str:
    """The endpoint without any user:password part, for printing and the manifest."""
    parts = urlsplit(endpoint())
    return (
        urlunsplit(parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")))
        if parts.hostname
        else endpoint()
    )


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_systems(params: dict[str, Any]) -> list[str]:
    run = params.get("run") or {}
    return list(run.get("systems") or []) + list(run.get("sc_systems") or [])


def system_folder(name: str, card: dict[str, Any], dest: Path) -> Path:
    """Where the system's weights go: `dest` / the last part of the card's requires.weights (else the name)."""
    rel = (card.get("requires") or {}).get("weights")
    return dest / (Path(rel).name if rel else name)


def _size(n: int | None) -> str:
    if n is None:
        return "size unknown"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _access_help(repo_id: str, hub: str) -> str:
    return (
        f"To get access: sign in on {hub}/{repo_id}, accept the licence (request access) there, create a "
        f"read token at {hub}/settings/tokens and set HF_TOKEN to it (or run `hf auth login`), then rerun "
        "`voicebias fetch`."
    )


def explain(exc: BaseException, repo_id: str, revision: str, filename: str | None = None) -> str:
    """One paragraph, for a person, for an error of huggingface_hub or of the network."""
    from huggingface_hub import errors as hf_errors

    hub = _shown_endpoint()
    what = f"{repo_id}@{revision}" + (f" ({filename})" if filename else "")
    response = getattr(exc, "response", None)
    server = (
        getattr(exc, "server_message", None)
        or (response.headers.get("X-Error-Message") if response is not None else None)
        or ""
    )
    status = getattr(response, "status_code", None)
    said = f" The hub says: {server.strip()}" if server else ""
    if isinstance(exc, hf_errors.GatedRepoError):
        return f"{what} is a gated repository ({status}).{said} {_access_help(repo_id, hub)}"
    if isinstance(exc, hf_errors.RevisionNotFoundError):
        return f"{what}: the revision '{revision}' is not in the repository.{said} Check `revision` on the card."
    if isinstance(exc, hf_errors.RemoteEntryNotFoundError):
        return f"{what}: the file is not in the repository at this revision.{said} Check `files` on the card."
    if isinstance(exc, hf_errors.RepositoryNotFoundError):
        return (
            f"{what}: the repository was not found, or it is private or gated and this request is not "
            f"authorised ({status}).{said} Check repo_id on the card. {_access_help(repo_id, hub)}"
        )
    if isinstance(exc, hf_errors.HfHubHTTPError):
        if status in (401, 403):
            return f"{what}: access refused ({status}).{said} {_access_help(repo_id, hub)}"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"{what}: the hub answered {status}: {first}{said}"
    if isinstance(exc, hf_errors.OfflineModeIsEnabled) or os.environ.get("HF_HUB_OFFLINE") == "1":
        return f"{what}: the hub is switched off (HF_HUB_OFFLINE=1); unset it to download."
    name = type(exc).__name__
    if "Connect" in name or "Timeout" in name or isinstance(exc, (ConnectionError, TimeoutError)):
        return f"{what}: cannot reach {hub} ({name}: {exc}). Check the network, or HF_ENDPOINT for a mirror."
    return f"{what}: {name}: {exc}"


def _file_list(entry: dict[str, Any], hub: str) -> list[str]:
    """The files of one entry: its `files`, else the repository's files at the revision (filtered)."""
    if entry.get("files"):
        return list(entry["files"])
    from huggingface_hub import HfApi

    info = HfApi(endpoint=hub).model_info(entry["repo_id"], revision=entry["revision"])
    names = sorted(s.rfilename for s in (info.siblings or []))
    patterns = entry.get("allow_patterns")
    if patterns:
        names = [n for n in names if any(fnmatch.fnmatch(n, p) for p in patterns)]
    if not names:
        raise FetchFailed(
            f"{entry['repo_id']}@{entry['revision']}: no file "
            + (f"matches allow_patterns {patterns}" if patterns else "in the repository")
        )
    return names


def fetch_entry(entry: dict[str, Any], folder: Path, dry_run: bool) -> dict[str, Any]:
    """Download (or, dry, resolve) one card entry into `folder`; its manifest record."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    hub = endpoint()
    repo_id, revision = entry["repo_id"], entry["revision"]
    local = folder / entry["subdir"] if entry.get("subdir") else folder
    current = None
    try:
        names = _file_list(entry, hub)
        current = names[0]
        meta = get_hf_file_metadata(hf_hub_url(repo_id, names[0], revision=revision, endpoint=hub), endpoint=hub)
    except FetchFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - every hub or network failure becomes one readable message
        _debug()
        raise FetchFailed(explain(exc, repo_id, revision, current)) from None
    commit = meta.commit_hash
    pin = "pinned" if entry["pinned"] else "NOT pinned"
    print(f"  {repo_id}@{revision} ({pin}) -> commit {commit} -> {local}")
    record: dict[str, Any] = {
        "repo_id": repo_id,
        "revision": revision,
        "pinned": entry["pinned"],
        "commit": commit,
        "local_dir": str(local),
        "files": {},
    }
    if dry_run:
        print(
            f"    would download {len(names)} file(s): "
            + ", ".join(names[:8])
            + (f", ... ({len(names) - 8} more)" if len(names) > 8 else "")
            + (f" (first: {_size(meta.size)})" if meta.size is not None else "")
        )
        record["files"] = {n: None for n in names}
        return record
    expected = entry.get("sha256") or {}
    for name in names:
        try:
            path = Path(hf_hub_download(repo_id, name, revision=commit, local_dir=local, endpoint=hub))
        except Exception as exc:  # noqa: BLE001
            _debug()
            raise FetchFailed(explain(exc, repo_id, revision, name)) from None
        digest = sha256_of(path)
        want = expected.get(name)
        if want is not None and digest != want:
            path.unlink(missing_ok=True)
            raise FetchFailed(
                f"{repo_id}@{commit}: {name} refused and deleted: its sha256 is {digest}, the card "
                f"says {want}. The hub served other bytes than the card was written for: check the "
                "card's revision and sha256, or the mirror in HF_ENDPOINT."
            )
        size = path.stat().st_size
        record["files"][name] = {"sha256": digest, "size": size}
        print(f"    {name}  {_size(size)}  sha256 {digest}" + ("  (matches the card)" if want else ""))
    return record


def _debug() -> None:
    if os.environ.get("VOICEBIAS_DEBUG") == "1":
        traceback.print_exc(file=sys.stderr)


def fetch_system(name: str, dest: Path, dry_run: bool) -> Outcome:
    from voicebias.cards import load_card

    try:
        card = load_card(name, config.CARDS_DIR)  # looked up now, so a test can point it elsewhere
    except (FileNotFoundError, ConfigError) as exc:
        return Outcome(name, "failed", str(exc))
    entries = card.get("weights") or []
    if not entries:
        why = (
            "its adapter needs no weights"
            if not (card.get("requires") or {}).get("weights")
            else f"its weights are not on the hub ({card.get('revision')}); see docs/repository-systems.md"
        )
        return Outcome(name, "skipped", f"nothing to fetch: {why}")
    folder = system_folder(name, card, dest)
    print(f"{name}: {len(entries)} hub {'repository' if len(entries) == 1 else 'repositories'} -> {folder}")
    for e in entries:
        if not e["pinned"]:
            print(
                f"voicebias fetch: warning: {name}: {e['repo_id']} revision '{e['revision']}' is not pinned to a "
                "commit; the commit the hub resolves is recorded in the manifest. Pin it on the card "
                f"(models/cards/{name}.yaml) to make the download reproducible.",
                file=sys.stderr,
            )
    records = []
    before = _tree(folder)
    try:
        for e in entries:
            records.append(fetch_entry(e, folder, dry_run))
    except FetchFailed as exc:
        removed = 0 if dry_run else remove_new(folder, before)
        note = f" ({removed} partly fetched file(s) of this run removed from {folder})" if removed else ""
        return Outcome(name, "failed", str(exc) + note, records)
    except BaseException:  # an interruption: what this run fetched is not left half-done either
        if not dry_run:
            remove_new(folder, before)
        raise
    return Outcome(name, "planned" if dry_run else "ok", "", records)


def _tree(folder: Path) -> set[Path]:
    """Every path under `folder` now (files and folders)."""
    return set(folder.rglob("*")) | {folder} if folder.exists() else set()


def remove_new(folder: Path, before: set[Path]) -> int:
    """Remove what appeared under `folder` since `before` (:func:`_tree`): the files a failed fetch
    wrote (the hub client's partial downloads and metadata included), then the folders it made that
    are left empty. Files that were there before stay. Returns how many files were removed."""
    if not folder.exists():
        return 0
    new = [p for p in folder.rglob("*") if p not in before]
    files = [p for p in new if p.is_file() or p.is_symlink()]
    for p in files:
        p.unlink(missing_ok=True)
    for d in sorted((p for p in new if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    if folder not in before and folder.exists() and not any(folder.iterdir()):
        folder.rmdir()
    # the hub client's own bookkeeping (.cache/huggingface) counts as files: report the weights only
    return sum(1 for p in files if ".cache" not in p.relative_to(folder).parts)


def pin_card(path: Path, records: list[dict[str, Any]]) -> list[str]:
    """Write what a complete fetch resolved into the card at `path`, in place (comments and order
    kept): each `weights` entry's revision becomes the commit the hub served, `pinned` true, and
    `sha256` every file's digest. Returns one line per entry that changed."""
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    card = yaml.load(path.read_text(encoding="utf-8"))
    changes = []
    for entry, rec in zip(card["weights"], records):
        sums = {name: f["sha256"] for name, f in rec["files"].items()}
        before = (entry.get("revision"), entry.get("pinned"), dict(entry.get("sha256") or {}))
        entry["revision"] = rec["commit"]
        if "pinned" in entry:
            entry["pinned"] = True
        entry["sha256"] = dict(sorted(sums.items()))
        if before != (rec["commit"], entry.get("pinned", before[1]), entry["sha256"]):
            changes.append(f"{rec['repo_id']}: revision {before[0]} -> {rec['commit']}, sha256 of {len(sums)} file(s)")
    with open(path, "w", encoding="utf-8") as fh:
        yaml.dump(card, fh)
    return changes


def write_manifest(dest: Path, outcomes: list[Outcome]) -> Path:
    """Merge the systems fetched completely into <dest>/fetched.json (other systems' records are kept)."""
    path = dest / MANIFEST
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            data = {}
    systems = data.get("systems") if isinstance(data.get("systems"), dict) else {}
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    for o in outcomes:
        if o.status == "ok":
            systems[o.system] = {"fetched_at": now, "endpoint": _shown_endpoint(), "weights": o.weights}
    data = {"note": "written by `voicebias fetch`; not tracked by git", "systems": dict(sorted(systems.items()))}
    dest.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def cmd_fetch(args: argparse.Namespace) -> int:
    from voicebias.io import resolve_path
    from voicebias.params import load_params

    names = list(args.systems) or default_systems(load_params())
    if not names:
        raise ConfigError("no systems named and the active profile lists none (run.systems, run.sc_systems)")
    unknown = [n for n in dict.fromkeys(names) if not (config.CARDS_DIR / f"{n}.yaml").is_file()]
    if unknown:
        known = sorted(p.stem for p in config.CARDS_DIR.glob("*.yaml"))
        raise NotFound(
            f"no system card for {', '.join(repr(n) for n in unknown)} in {config.CARDS_DIR}; known: {', '.join(known)}"
        )
    dest = resolve_path(args.dest, config.ROOT)  # relative to the repository root, like the cards' paths
    print(
        f"voicebias fetch: {'dry run, nothing is downloaded; ' if args.dry_run else ''}hub {_shown_endpoint()}, "
        f"destination {dest}",
        file=sys.stderr,
    )
    outcomes = [fetch_system(n, dest, args.dry_run) for n in dict.fromkeys(names)]
    failed = [o for o in outcomes if o.status == "failed"]
    for o in outcomes:
        if o.status == "failed":
            print(f"voicebias fetch: {o.system} FAILED: {o.message}", file=sys.stderr)
        elif o.status == "skipped":
            print(f"voicebias fetch: {o.system}: {o.message}", file=sys.stderr)
    if not args.dry_run and any(o.status == "ok" for o in outcomes):
        print(f"voicebias fetch: manifest {write_manifest(dest, outcomes)}", file=sys.stderr)
    if args.pin and not args.dry_run:
        for o in outcomes:
            if o.status != "ok":
                continue
            card_path = config.CARDS_DIR / f"{o.system}.yaml"
            changes = pin_card(card_path, o.weights)
            for line in changes or ["already pinned to what was fetched"]:
                print(f"voicebias fetch: pinned {card_path}: {line}", file=sys.stderr)
    summary = ", ".join(f"{o.system} {o.status}" for o in outcomes)
    print(f"voicebias fetch: {summary}", file=sys.stderr)
    return 1 if failed else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `fetch` on the command's subparsers."""
    p = sub.add_parser(
        "fetch", help="download the hub weights the system cards list, at their revision, and verify them"
    )
    p.add_argument(
        "systems",
        nargs="*",
        metavar="SYSTEM",
        help="systems to fetch (default: the active profile's run.systems and run.sc_systems)",
    )
    p.add_argument(
        "--dest",
        default=DEFAULT_DEST,
        help=f"folder for the weights, one subfolder per system, relative to the repository root (default: "
        f"{DEFAULT_DEST}, untracked); "
        f"{MANIFEST} there records what was fetched",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="resolve the revisions and print what would be downloaded; download nothing",
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="write each fetched repository's resolved commit and every file's sha256 into the system's card",
    )
    p.set_defaults(fn=cmd_fetch)


__all__ = [
    "DEFAULT_DEST",
    "MANIFEST",
    "Outcome",
    "add_parser",
    "cmd_fetch",
    "default_systems",
    "endpoint",
    "fetch_system",
    "pin_card",
    "remove_new",
    "sha256_of",
    "system_folder",
    "write_manifest",
]
