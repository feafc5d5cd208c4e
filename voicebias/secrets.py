"""Secrets and the environment of child processes: the project's one policy.

Keys (API keys, the Azure subscription key and its region/endpoint settings) are read
by name from the environment, else from a ``.env`` file at the repository root. The
file is parsed, never loaded: nothing here writes ``os.environ``, so a key read from
``.env`` is handed to the one client that needs it and never reaches a child process.
Callers must not log, store or echo a value (see :func:`redact`).

Keys never belong in params.yaml, cards or the endpoint lists (they reach git, dvc.lock and
MLflow from there): :func:`url_credentials` and :func:`not_a_variable_name` say what is wrong
with a URL that carries credentials or a ``*_env`` value that is a key rather than the name of
a variable, without repeating the value.

Child processes that run third-party code (a model repository's driver, VoiceQualityVC)
get :func:`child_env`: an allow-list of the variables such code needs to find its
interpreter, locale, temporary folder, GPU and model caches, plus the values the caller
sets and the names listed in ``VOICEBIAS_CHILD_ENV`` (comma or space separated). Every
other variable, keys included, stays in this process.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Mapping

#: Variables a child process may inherit (besides the LC_* locale family).
CHILD_ENV_ALLOWED = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "TZ",
        "LANG",
        "LANGUAGE",
        "TMPDIR",
        "TMP",
        "TEMP",
        "SYSTEMROOT",
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "CUDA_HOME",
        "NVIDIA_VISIBLE_DEVICES",
        "LD_LIBRARY_PATH",
        "PYTORCH_CUDA_ALLOC_CONF",
        "CUBLAS_WORKSPACE_CONFIG",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "TOKENIZERS_PARALLELISM",
        "HF_HOME",
        "HF_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "TRANSFORMERS_CACHE",
        "TORCH_HOME",
        "XDG_CACHE_HOME",
        "PYTHONHASHSEED",
    }
)
CHILD_ENV_PREFIXES = ("LC_",)
#: Names of further variables to pass to child processes, set by the user.
CHILD_ENV_EXTRA = "VOICEBIAS_CHILD_ENV"


_VARIABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: the prefixes of common API keys and tokens (OpenAI, Anthropic, Google, Hugging Face, GitHub, Slack, Groq,
#: Replicate, xAI, AWS access keys)
_KEY_PREFIXES = ("sk-", "sk_", "AIza", "hf_", "ghp_", "gho_", "github_pat_", "xox", "gsk_", "r8_", "xai-", "AKIA")
#: query parameters that carry credentials in a URL
_SECRET_QUERY = re.compile(
    r"(^|[_-])(key|apikey|api_key|token|access_token|auth|password|passwd|secret|sig|signature|code)$", re.I
)


def not_a_variable_name(value: str) -> str | None:
    """Why `value` cannot be the name of an environment variable that holds a key (None when it can be):
    not a variable name at all, or shaped like a key itself (a key's prefix, or a long mix of lower- and
    upper-case letters and digits). The value itself is never part of the answer."""
    v = str(value)
    if v.startswith(_KEY_PREFIXES):
        return "holds what looks like a key (it starts like one), not the name of the variable that holds it"
    if not _VARIABLE_NAME.match(v):
        return "must be the name of an environment variable (letters, digits and _), not a key or other value"
    classes = sum(bool(re.search(p, v)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]"))
    if (len(v) >= 24 and classes == 3) or (len(v) >= 32 and classes >= 2 and re.search(r"[0-9]", v)):
        return "holds what looks like a key (a long run of mixed letters and digits), not the name of a variable"
    return None


def url_credentials(url: str) -> str | None:
    """Why `url` must not be written into params, a card or an endpoint list (None when it is clean): a
    user name or password before the host, or a credential in its query. The value is never repeated."""
    from urllib.parse import parse_qsl, urlsplit

    try:
        u = urlsplit(str(url))
    except ValueError:
        return None  # not a URL: the caller's own check says so
    if u.username is not None or u.password is not None:
        return (
            "holds credentials before the host (user:password@); give the address alone and put the key in the "
            "environment or .env, named by api_key_env"
        )
    names = [k for k, _ in parse_qsl(u.query, keep_blank_values=True) if _SECRET_QUERY.search(k)]
    if names:
        return (
            f"carries a credential in its query ({', '.join(sorted(set(names)))}=...); give the address alone "
            "and put the key in the environment or .env, named by api_key_env"
        )
    return None


def _default_root() -> Path:
    from voicebias.config import ROOT

    return ROOT


def dotenv_path(root: str | os.PathLike[str] | None = None) -> Path:
    """The .env file the project reads: <root>/.env (the repository root by default)."""
    return Path(root if root is not None else _default_root()) / ".env"


def read_secret(name: str, root: str | os.PathLike[str] | None = None) -> str | None:
    """The value of `name` from the environment, else from <root>/.env; None if unset or empty.

    The value is stripped of surrounding whitespace. The .env file is parsed without
    copying anything into the environment.
    """
    value = (os.environ.get(name) or "").strip()
    if value:
        return value
    env = dotenv_path(root)
    if env.is_file():
        from dotenv import dotenv_values

        value = (dotenv_values(env).get(name) or "").strip()
    return value or None


def require_secret(who: str, name: str, root: str | os.PathLike[str] | None = None, *, error: type[Exception]) -> str:
    """`read_secret(name)`, or `error` (the caller's setup error) naming `who` and the variable; a `name`
    that is a key rather than a variable name is refused without being repeated."""
    wrong = not_a_variable_name(name)
    if wrong:
        raise error(f"{who}: its api_key_env {wrong}; set the key in the environment or .env and name its variable")
    value = read_secret(name, root)
    if not value:
        raise error(
            f"{who} needs the environment variable {name} (set it in the environment or in .env at the repository root)"
        )
    return value


def child_env(extra: Mapping[str, str] | None = None, names: Iterable[str] = ()) -> dict[str, str]:
    """The environment for a child process that runs third-party code.

    Only the allow-listed variables of this process pass (CHILD_ENV_ALLOWED, LC_*), plus
    `names` and the names listed in $VOICEBIAS_CHILD_ENV; `extra` sets values on top.
    """
    listed = set(re.split(r"[\s,]+", os.environ.get(CHILD_ENV_EXTRA, "").strip())) - {""}
    passed = CHILD_ENV_ALLOWED | set(names) | listed
    env = {k: v for k, v in os.environ.items() if k in passed or k.startswith(CHILD_ENV_PREFIXES)}
    env.update(extra or {})
    return env


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """`text` with every secret (and every 8+ character piece a server may echo) replaced."""
    for s in secrets:
        if s:
            text = text.replace(s, "[redacted]")
            if len(s) >= 16:  # servers echo keys partly masked: hide any long run of the key
                for i in range(0, len(s) - 8 + 1):
                    piece = s[i : i + 8]
                    if piece in text:
                        text = text.replace(piece, "[redacted]")
    return text
