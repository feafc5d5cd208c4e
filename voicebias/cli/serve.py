"""`voicebias serve SYSTEM... [--replicas N] [--gpus 0,1,...]`: start the servers of open systems
outside DVC, and `voicebias serve --stop [SYSTEM...]` to end them.

For every system, N replicas of its server, each on its own port: a **vllm_omni** card's
`deploy.command` at its pinned revision, or for a **repository** system the shim
(:mod:`voicebias.serving.shim`) around its driver, in the system's own environment. With `--gpus`
each replica gets `CUDA_VISIBLE_DEVICES` round-robin. The command waits until every replica is
healthy, then writes the endpoints file (voicebias.clients.endpoints), keeping other systems'
entries; `--stop` ends the replicas and removes exactly the URLs it had written.

The options, logs and failures: docs/serving.md, "Starting servers: voicebias serve".
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from voicebias.errors import ConfigError

SHIM = Path(__file__).resolve().parent.parent / "serving" / "shim.py"
PIDS_FILE = "pids.json"
#: the variable that hands a shim its bearer token (voicebias.serving.shim.TOKEN_ENV)
SHIM_TOKEN_ENV = "VOICEBIAS_SHIM_TOKEN"
DEFAULT_PORT = 8091
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class ServeError(ConfigError):
    """A server could not be started (or stopped) as asked; the message says why."""


@dataclass
class Replica:
    system: str
    index: int
    argv: list[str]
    cwd: str
    port: int
    url: str
    log: str
    max_concurrency: int
    env: dict[str, str] = field(default_factory=dict, repr=False)  # never written anywhere
    gpus: str | None = None
    pid: int | None = None
    start_time: str | None = None
    token: str | None = field(default=None, repr=False)  # the shim's bearer token: in env and the endpoints file only
    revision: str | None = None  # the `--revision` a vLLM server was started with (in the endpoints file)


# ---------------------------------------------------------------------------- command lines


def vllm_command(card: dict[str, Any], port: int, host: str = "127.0.0.1", vllm: str = "vllm") -> list[str]:
    """The card's `vllm serve ... --omni` command for one replica (its env assignments left out)."""
    deploy = card.get("deploy") or {}
    template = deploy.get("command")
    name = card.get("name", "?")
    if not template:
        raise ServeError(f"the card of '{name}' has no deploy.command to start its server with")
    revision = str(card.get("revision") or "")
    if not _COMMIT.match(revision):
        raise ServeError(
            f"the card of '{name}' pins no revision ({revision!r}); write the 40-hex Hugging Face "
            "commit to serve into its 'revision' first (docs/serving.md)"
        )
    words = shlex.split(" ".join(str(template).split()))
    while words and _ENV_ASSIGN.match(words[0]):
        words.pop(0)
    if words[:2] != ["vllm", "serve"] or "--omni" not in words:
        raise ServeError(
            f"the card of '{name}': deploy.command must be 'vllm serve <model> --omni ...', got {template!r}"
        )
    words = [w.replace("<revision>", revision) for w in words]
    out: list[str] = [vllm, "serve"]
    rest = iter(words[2:])
    for w in rest:
        if w in ("--port", "--host"):
            next(rest, None)  # this replica's own values follow
            continue
        if w.startswith(("--port=", "--host=")):
            continue
        out.append(w)
    if "--revision" not in out:
        out += ["--revision", revision]
    if card.get("checkpoint") and card["checkpoint"] not in out:
        raise ServeError(f"the card of '{name}': deploy.command does not serve its checkpoint {card['checkpoint']}")
    return out + ["--host", host, "--port", str(port)]


def _revision_arg(argv: Sequence[str]) -> str | None:
    """The value of `--revision` in a vLLM command line, or None."""
    for i, a in enumerate(argv):
        if a == "--revision" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--revision="):
            return a.split("=", 1)[1]
    return None


def vllm_env(card: dict[str, Any], params: dict[str, Any], gpus: str | None) -> dict[str, str]:
    """The variables one vLLM-Omni replica's environment gets on top of the allow-listed ones."""
    deploy = {**(card.get("deploy") or {}), **(params.get("deploy") or {})}
    env = {}
    if deploy.get("batch_invariant", True):
        env["VLLM_BATCH_INVARIANT"] = "1"
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


def client_host(host: str) -> str:
    """The address a client on this machine reaches a server bound to `host` at: loopback for the
    wildcard addresses, else `host` itself (IPv6 in brackets)."""
    if host in ("", "0.0.0.0", "::"):
        return "127.0.0.1"
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:  # a host name
        return host


def _gpu_sets(gpus: str | None, per_replica: int, count: int) -> list[str | None]:
    if not gpus:
        return [None] * count
    ids = [g.strip() for g in gpus.split(",") if g.strip()]
    if not ids:
        raise ServeError(f"--gpus {gpus!r} names no device")
    if per_replica > len(ids):
        raise ServeError(f"--gpus-per-replica {per_replica} is more than the {len(ids)} devices --gpus names")
    return [",".join(ids[(i * per_replica + j) % len(ids)] for j in range(per_replica)) for i in range(count)]


# ---------------------------------------------------------------------------- planning


def plan(
    systems: Sequence[str],
    params: dict[str, dict[str, Any]],
    root: Path,
    state_dir: Path,
    *,
    replicas: int = 1,
    gpus: str | None = None,
    gpus_per_replica: int = 1,
    port_base: int = DEFAULT_PORT,
    host: str = "127.0.0.1",
    python: str | None = None,
    driver: str | None = None,
    max_concurrency: int | None = None,
    cards_dir: Path | None = None,
) -> list[Replica]:
    """Every replica to start: its command line, environment, port and log (nothing is started)."""
    from voicebias.cards import load_card
    from voicebias.secrets import child_env
    from voicebias.systems.catalog import build_system

    if replicas < 1:
        raise ServeError("--replicas must be at least 1")
    if len(set(systems)) != len(systems):
        raise ServeError("a system is named twice")
    devices = _gpu_sets(gpus, gpus_per_replica, replicas * len(systems))
    kw = {"cards_dir": cards_dir} if cards_dir is not None else {}
    out: list[Replica] = []
    for system in systems:
        card = load_card(system, **kw)
        sp = dict(params.get(system) or {})
        adapter = card.get("adapter")
        if adapter == "vllm_omni":
            vllm = str(Path(python).parent / "vllm") if python else "vllm"
            token = secrets.token_urlsafe(32)  # vLLM wants it on /v1 (VLLM_API_KEY); the endpoints file holds it
            for i in range(replicas):
                port, dev = port_base + len(out), devices[len(out)]
                argv = vllm_command({"name": system, **card}, port, host, vllm)
                out.append(
                    Replica(
                        system,
                        i,
                        argv,
                        str(root),
                        port,
                        f"http://{client_host(host)}:{port}/v1",
                        str(state_dir / f"{system}-{i}.log"),
                        max_concurrency or int(sp.get("max_concurrency") or 8),
                        env=child_env(
                            {**vllm_env(card, sp, dev), "PYTHONUNBUFFERED": "1", "VLLM_API_KEY": token},
                            names=("HF_TOKEN", "HF_HOME", "HF_ENDPOINT"),
                        ),
                        gpus=dev,
                        token=token,
                        revision=_revision_arg(argv),
                    )
                )
            continue
        if python:
            sp["python"] = python
        built = build_system(system, sp, root=root, local=True, **kw)
        try:
            backend = getattr(built, "backend", None)
            if backend is None:
                raise ServeError(
                    f"system '{system}' (adapter {adapter}) has no server to start: voicebias serve "
                    "starts vllm_omni cards and repository systems"
                )
            if backend.command is not None and driver is None:
                raise ServeError(f"system '{system}' runs a 'command' per request; the shim serves drivers only")
            script = Path(driver).resolve() if driver else backend.driver_path
            if not script.is_file():
                raise ServeError(f"system '{system}': driver {script} not found")
            config = json.dumps(backend.driver_config())
            model = str(card.get("checkpoint") or system)
            token = secrets.token_urlsafe(32)  # one per system: its shims take it, its endpoints send it
            for i in range(replicas):
                port, dev = port_base + len(out), devices[len(out)]
                env = backend.env()
                env[SHIM_TOKEN_ENV] = token
                if dev is not None:
                    env["CUDA_VISIBLE_DEVICES"] = dev
                argv = [
                    backend.python,
                    str(SHIM),
                    "--driver",
                    str(script),
                    "--config",
                    config,
                    "--model",
                    model,
                    "--host",
                    host,
                    "--port",
                    str(port),
                    "--startup-timeout-s",
                    str(sp.get("startup_timeout_s") or built.params["startup_timeout_s"]),
                    "--timeout-s",
                    str(backend.timeout_s),
                ]
                out.append(
                    Replica(
                        system,
                        i,
                        argv,
                        str(backend.checkout),
                        port,
                        f"http://{client_host(host)}:{port}/v1",
                        str(state_dir / f"{system}-{i}.log"),
                        max_concurrency or 1,
                        env=env,
                        gpus=dev,
                        token=token,
                    )
                )
        finally:
            built.close()
    return out


# ---------------------------------------------------------------------------- processes


def _proc_start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot) from /proc, to tell it from a later reuse of its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, start_time: str | None = None) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # reaps it when this process started it
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state in ("Z", "X"):
            return False
    except OSError:
        pass
    now = _proc_start_time(pid)
    return start_time is None or now is None or now == start_time


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _tail(path: str, n: int = 20) -> str:
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(lines[-n:])


def _healthy(url: str) -> bool:
    base = url[:-3] if url.endswith("/v1") else url
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _end(procs: Sequence[tuple[int, str | None]], grace_s: float) -> list[int]:
    """SIGTERM each (pid, start time) process group, SIGKILL after `grace_s`; the pids that needed SIGKILL."""
    live = [(pid, st) for pid, st in procs if _alive(pid, st)]
    for pid, _ in live:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(pid, st) for pid, st in live):
        time.sleep(0.1)
    killed = [pid for pid, st in live if _alive(pid, st)]
    for pid in killed:
        _signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid, st) for pid, st in live):
        time.sleep(0.1)
    return killed


def launch(
    replicas: Sequence[Replica], host: str = "127.0.0.1", startup_timeout_s: float = 1800.0, grace_s: float = 20.0
) -> list[Replica]:
    """Start every replica, each in its own session (process group), and wait until all are healthy.

    A replica that exits, or is not healthy within `startup_timeout_s`, ends every replica
    started here and raises ServeError with the tail of its log.
    """
    busy = [r.port for r in replicas if not _port_free(host, r.port)]
    if busy:
        raise ServeError(f"port(s) {', '.join(map(str, busy))} are in use on {host}; pick another --port-base")
    started: list[tuple[Replica, subprocess.Popen]] = []
    try:
        for r in replicas:
            Path(r.log).parent.mkdir(parents=True, exist_ok=True)
            with open(r.log, "w", encoding="utf-8") as log:
                log.write(
                    f"# voicebias serve: {r.system} replica {r.index}, port {r.port}"
                    f"{f', CUDA_VISIBLE_DEVICES={r.gpus}' if r.gpus is not None else ''}\n"
                )
                log.flush()
                try:
                    proc = subprocess.Popen(
                        r.argv,
                        cwd=r.cwd,
                        env=r.env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                except OSError as exc:
                    raise ServeError(f"{r.system} replica {r.index}: cannot start {r.argv[0]}: {exc}") from None
            r.pid, r.start_time = proc.pid, _proc_start_time(proc.pid)
            started.append((r, proc))
        deadline = time.monotonic() + startup_timeout_s
        waiting = list(started)
        while waiting:
            for r, proc in list(waiting):
                if proc.poll() is not None:
                    raise ServeError(
                        f"{r.system} replica {r.index} (port {r.port}) exited with code {proc.returncode} "
                        f"before it was healthy; the end of {r.log}:\n{_tail(r.log)}"
                    )
                if _healthy(r.url):
                    waiting.remove((r, proc))
            if waiting and time.monotonic() > deadline:
                r = waiting[0][0]
                raise ServeError(
                    f"{r.system} replica {r.index} (port {r.port}) was not healthy within "
                    f"{startup_timeout_s:g} s; the end of {r.log}:\n{_tail(r.log)}"
                )
            if waiting:
                time.sleep(0.2)
    except BaseException:
        _end([(r.pid, r.start_time) for r, _ in started], grace_s)
        for _, proc in started:
            try:
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        raise
    return [r for r, _ in started]


# ---------------------------------------------------------------------------- state files


def _read_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ServeError(f"{path} cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ServeError(f"{path} must hold a JSON object")
    return data


def _write_json(path: Path, data: dict[str, Any], private: bool = False) -> None:
    """Write atomically; `private` files (the endpoints file, which holds the shims' tokens) are
    readable by their owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def record(replicas: Sequence[Replica], endpoints_path: Path, state_dir: Path) -> None:
    """Add the replicas to the endpoints file (other systems' entries kept) and to the pid file."""
    endpoints = _read_json(endpoints_path)
    pids = _read_json(state_dir / PIDS_FILE)
    for system in dict.fromkeys(r.system for r in replicas):
        mine = [r for r in replicas if r.system == system]
        endpoints[system] = [
            {
                "url": r.url,
                "weight": 1,
                "max_concurrency": r.max_concurrency,
                **({"token": r.token} if r.token else {}),
                **({"revision": r.revision} if r.revision else {}),
            }
            for r in mine
        ]
        pids[system] = [
            {
                "pid": r.pid,
                "start_time": r.start_time,
                "port": r.port,
                "url": r.url,
                "log": r.log,
                "gpus": r.gpus,
                "program": Path(r.argv[0]).name,
            }
            for r in mine
        ]
    _write_json(endpoints_path, endpoints, private=True)
    _write_json(state_dir / PIDS_FILE, pids)


def stop(
    systems: Sequence[str], endpoints_path: Path, state_dir: Path, grace_s: float = 20.0, warn: Any = None
) -> dict[str, int]:
    """End the recorded replicas of `systems` (all when empty); {system: replicas ended}.

    A replica is signalled (its process group) only when its pid still belongs to the process
    started then: the start time recorded with it must match the one the system gives now. An entry
    without a start time, or whose pid now runs another process, is not signalled; `warn` (a
    callable) is told so, and the entry is removed as the others are."""
    pids = _read_json(state_dir / PIDS_FILE)
    names = list(systems) or list(pids)
    unknown = [s for s in names if s not in pids]
    if unknown:
        raise ServeError(f"no server of {', '.join(unknown)} is recorded in {state_dir / PIDS_FILE}")
    procs = []
    for s in names:
        for e in pids[s]:
            pid, st = e.get("pid"), e.get("start_time")
            if not isinstance(pid, int) or not st:
                if warn is not None:
                    warn(
                        f"{s}: pid {pid} was recorded without a start time, so it cannot be told from another "
                        "process that holds that pid now; not signalled (end it yourself if it is the replica)"
                    )
                continue
            now = _proc_start_time(pid)
            if now is not None and now != str(st):
                if warn is not None:
                    warn(f"{s}: pid {pid} now belongs to another process (started later); not signalled")
                continue
            procs.append((pid, str(st)))
    _end(procs, grace_s)
    endpoints = _read_json(endpoints_path)
    for s in names:
        urls = {e["url"] for e in pids[s]}
        if s in endpoints:
            left = [e for e in endpoints[s] if not (isinstance(e, dict) and e.get("url") in urls)]
            if left:
                endpoints[s] = left
            else:
                del endpoints[s]
    if endpoints_path.exists():
        _write_json(endpoints_path, endpoints)
    ended = {s: len(pids.pop(s)) for s in names}
    _write_json(state_dir / PIDS_FILE, pids)
    return ended


# ---------------------------------------------------------------------------- the command


def _paths() -> tuple[Path, Path, Path]:
    """(project root, endpoints file, state folder), read now (VOICEBIAS_ROOT, VOICEBIAS_CACHE, VOICEBIAS_ENDPOINTS)."""
    from voicebias.clients.endpoints import endpoints_file
    from voicebias.config import find_root

    root = find_root()
    cache = Path(os.environ["VOICEBIAS_CACHE"]) if os.environ.get("VOICEBIAS_CACHE") else root / ".cache"
    return root, endpoints_file(root), cache / "serve"


def _system_params(root: Path) -> dict[str, dict[str, Any]]:
    from voicebias.params import load_params

    path = root / "params.yaml"
    return dict(load_params(path).get("systems") or {}) if path.exists() else {}


def cmd_serve(args: argparse.Namespace) -> int:
    root, endpoints_path, state_dir = _paths()
    if args.stop:
        ended = stop(
            args.systems,
            endpoints_path,
            state_dir,
            args.grace,
            warn=lambda m: print(f"voicebias serve: {m}", file=sys.stderr),
        )
        for s, n in ended.items():
            print(f"{s}: {n} replica(s) ended; its endpoints are gone from {endpoints_path}")
        return 0
    if not args.systems:
        raise ServeError("name the system(s) to serve, e.g. voicebias serve qwen2_5_omni_vllm --replicas 2")
    running = _read_json(state_dir / PIDS_FILE)
    again = [s for s in args.systems if s in running and any(_alive(e["pid"], e.get("start_time")) for e in running[s])]
    if again:
        raise ServeError(
            f"{', '.join(again)} already served (see {state_dir / PIDS_FILE}); "
            f"voicebias serve --stop {' '.join(again)} first"
        )
    replicas = plan(
        args.systems,
        _system_params(root),
        root,
        state_dir,
        replicas=args.replicas,
        gpus=args.gpus,
        gpus_per_replica=args.gpus_per_replica,
        port_base=args.port_base,
        host=args.host,
        python=args.python,
        driver=args.driver,
        max_concurrency=args.max_concurrency,
    )
    started = launch(replicas, args.host, args.startup_timeout, args.grace)
    record(started, endpoints_path, state_dir)
    for r in started:
        print(
            f"{r.system} replica {r.index}: {r.url} (pid {r.pid}"
            f"{f', CUDA_VISIBLE_DEVICES={r.gpus}' if r.gpus is not None else ''}; log {r.log})"
        )
    print(f"endpoints written to {endpoints_path}; stop them with voicebias serve --stop")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `serve` on the command's subparsers."""
    p = sub.add_parser(
        "serve", help="start (or --stop) OpenAI-compatible servers of open systems and write the endpoints file"
    )
    p.add_argument("systems", nargs="*", metavar="SYSTEM")
    p.add_argument("--replicas", type=int, default=1, help="servers per system (default 1)")
    p.add_argument("--gpus", help="devices to hand out round-robin, e.g. 0,1,2,3 (CUDA_VISIBLE_DEVICES per replica)")
    p.add_argument("--gpus-per-replica", type=int, default=1)
    p.add_argument(
        "--port-base", type=int, default=DEFAULT_PORT, help=f"first port (default {DEFAULT_PORT}), one up per replica"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--python",
        help="the interpreter of the system's own environment (repository systems), or of "
        "the environment whose vllm runs (vllm_omni cards)",
    )
    p.add_argument("--driver", help="a driver script of your own replacing the system's shipped one (same protocol)")
    p.add_argument(
        "--max-concurrency",
        type=int,
        help="max_concurrency per endpoint in the endpoints file (default: 1 for a shim, the system's or 8 for vLLM)",
    )
    p.add_argument("--startup-timeout", type=float, default=1800.0, help="seconds to wait for /health (default 1800)")
    p.add_argument("--grace", type=float, default=20.0, help="seconds between SIGTERM and SIGKILL (default 20)")
    p.add_argument("--stop", action="store_true", help="end the recorded servers of SYSTEM... (default: all)")
    p.set_defaults(fn=cmd_serve)


__all__ = [
    "Replica",
    "ServeError",
    "add_parser",
    "cmd_serve",
    "launch",
    "plan",
    "record",
    "stop",
    "vllm_command",
    "vllm_env",
]
