"""A fake Hugging Face hub on 127.0.0.1 speaking the protocol huggingface_hub downloads with.

It answers, as huggingface.co does:

- ``HEAD|GET /{repo_id}/resolve/{revision}/{path}``: the revision (a branch, a tag or a
  commit) is resolved to a commit, sent back in ``X-Repo-Commit``. A regular file answers
  200 with its git blob id as ``ETag`` and its bytes; a large (LFS) file answers
  ``302`` to a second server standing in for the CDN (another origin, so huggingface_hub
  stops its HEAD there, as it does for the hub's signed storage URLs) with the file's
  sha256 in ``X-Linked-Etag`` and its size in ``X-Linked-Size``.
- ``GET /api/models/{repo_id}`` and ``/api/models/{repo_id}/revision/{revision}``: the model
  info (``id``, ``sha``, ``siblings``) that `HfApi.model_info` reads.
- errors with the hub's ``X-Error-Code`` and ``X-Error-Message`` headers: ``RepoNotFound``
  (401), ``RevisionNotFound`` and ``EntryNotFound`` (404), and ``GatedRepo`` for a gated
  repository's files: 401 without a token, 403 with a token not on its list (the model
  info stays public, as on the hub).

Every request is logged as (method, path, whether it carried a token), for tests to
check what was (not) downloaded. Tokens are compared, never logged.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote, urlparse

from tests.fakes.http import send_json, start_loopback, stop_loopback

LFS_SUFFIXES = (".bin", ".safetensors", ".pt", ".ckpt", ".npy")


def git_blob_id(data: bytes) -> str:
    """The git object id of a blob: what the hub sends as the ETag of a regular file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class FakeRepo:
    """A model repository: commits (40 hex) -> {path: bytes}, refs (branch/tag -> commit), gating."""

    repo_id: str
    commits: dict[str, dict[str, bytes]]
    refs: dict[str, str] = field(default_factory=dict)
    gated: bool = False
    authorised_tokens: tuple[str, ...] = ()

    def resolve(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.refs.get(revision)


@dataclass
class Logged:
    method: str
    path: str
    token: bool


class FakeHub:
    """The hub and its CDN, each on a free loopback port; use as a context manager."""

    def __init__(self, repos: list[FakeRepo]):
        self.repos = {r.repo_id: r for r in repos}
        self.log: list[Logged] = []
        self._lock = threading.Lock()
        self._blobs: dict[str, bytes] = {}
        for r in repos:
            for files in r.commits.values():
                for data in files.values():
                    self._blobs[sha256(data)] = data
        self.url = self.cdn_url = ""

    # -- lifecycle
    def __enter__(self) -> "FakeHub":
        self._hub, self.url = start_loopback(self._hub_handler())
        self._cdn, self.cdn_url = start_loopback(self._cdn_handler())
        return self

    def __exit__(self, *exc) -> None:
        stop_loopback(self._hub)
        stop_loopback(self._cdn)

    def requests(self, method: str | None = None, contains: str = "") -> list[Logged]:
        with self._lock:
            return [x for x in self.log if (method is None or x.method == method) and contains in x.path]

    def _record(self, method: str, path: str, token: bool) -> None:
        with self._lock:
            self.log.append(Logged(method, path, token))

    # -- the hub
    def _hub_handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _token(self) -> str | None:
                auth = self.headers.get("Authorization") or ""
                return auth[len("Bearer ") :] if auth.startswith("Bearer ") else None

            def _error(self, status: int, code: str | None, message: str, extra: dict | None = None) -> None:
                headers = {"X-Error-Message": message, **(extra or {})}
                if code:
                    headers["X-Error-Code"] = code
                body = {"error": message}
                if self.command == "HEAD":
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    send_json(self, status, body, headers)

            def do_HEAD(self):
                self._serve()

            def do_GET(self):
                self._serve()

            def _serve(self):
                path = unquote(urlparse(self.path).path)
                hub._record(self.command, path, self._token() is not None)
                if path.startswith("/api/models/"):
                    return self._model_info(path[len("/api/models/") :])
                parts = path.lstrip("/").split("/")
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
                self._error(404, None, "Not found")

            def _repo(self, repo_id: str) -> FakeRepo | None:
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self._error(401, "RepoNotFound", "Repository not found")
                return repo

            def _model_info(self, rest: str) -> None:
                repo_id, _, revision = rest.partition("/revision/")
                repo = self._repo(repo_id)
                if repo is None:
                    return
                commit = repo.resolve(revision or "main")
                if commit is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                files = repo.commits[commit]
                send_json(
                    self,
                    200,
                    {
                        "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
                        "id": repo_id,
                        "modelId": repo_id,
                        "author": repo_id.split("/")[0],
                        "sha": commit,
                        "private": False,
                        "gated": "manual" if repo.gated else False,
                        "disabled": False,
                        "tags": [],
                        "siblings": [{"rfilename": name} for name in sorted(files)],
                    },
                )

            def _resolve(self, repo_id: str, revision: str, filename: str) -> None:
                repo = self._repo(repo_id)
                if repo is None:
                    return
                if repo.gated:
                    token = self._token()
                    if token is None:
                        return self._error(
                            401,
                            "GatedRepo",
                            f"Access to model {repo_id} is restricted. You must "
                            "have access to it and be authenticated to access it. Please log in.",
                        )
                    if token not in repo.authorised_tokens:
                        return self._error(
                            403,
                            "GatedRepo",
                            f"Access to model {repo_id} is restricted and you are "
                            f"not in the authorized list. Visit {hub.url}/{repo_id} to ask for access.",
                        )
                commit = repo.resolve(revision)
                if commit is None:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
                files = repo.commits[commit]
                if filename not in files:
                    return self._error(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit})
                data = files[filename]
                common = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
                if filename.endswith(LFS_SUFFIXES):
                    digest = sha256(data)
                    self.send_response(302)
                    headers = {
                        **common,
                        "Location": f"{hub.cdn_url}/blobs/{digest}",
                        "ETag": f'"{git_blob_id(data)}"',
                        "X-Linked-Etag": f'"{digest}"',
                        "X-Linked-Size": str(len(data)),
                        "Content-Length": "0",
                    }
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    return
                self.send_response(200)
                for k, v in {
                    **common,
                    "ETag": f'"{git_blob_id(data)}"',
                    "Content-Length": str(len(data)),
                    "Content-Type": "application/octet-stream",
                }.items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(data)

        return Handler

    # -- the CDN (another origin)
    def _cdn_handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._serve()

            def do_GET(self):
                self._serve()

            def _serve(self):
                path = urlparse(self.path).path
                hub._record(f"CDN-{self.command}", path, bool(self.headers.get("Authorization")))
                digest = path.rsplit("/", 1)[-1]
                data = hub._blobs.get(digest)
                if data is None:
                    body = json.dumps({"error": "NoSuchKey"}).encode()
                    self.send_response(404)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.send_header("ETag", f'"{digest}"')
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(data)

        return Handler
