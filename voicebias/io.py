"""Small, deterministic writers for tables and metrics."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voicebias.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd


def _clean(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf; null reads as 'not estimable'
    return v


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(_clean(data), fh, indent=2, sort_keys=True, ensure_ascii=False)
        fh.write("\n")


def read_text(path: Path | str) -> str:
    """A text file's contents; ConfigError naming the file and the byte where it is not UTF-8.

    A missing file raises FileNotFoundError, as open() does."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 4]!r}); save it as UTF-8"
        ) from exc


def read_yaml(path: Path | str) -> Any:
    """A YAML file parsed; ConfigError naming the file, line and column of a syntax error (or the
    byte that is not UTF-8)."""
    import yaml

    text = read_text(path)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}:{where}: not valid YAML ({problem})") from exc


def parse_json(text: str, source: str) -> Any:
    """JSON parsed from `text`; ConfigError naming `source`, line and column when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{source}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file parsed; ConfigError when it is not UTF-8 or not JSON (FileNotFoundError when missing)."""
    return parse_json(read_text(path), str(path))


def write_table(path: Path, df: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False, float_format="%.10g", lineterminator="\n")


def read_table(path: Path) -> pd.DataFrame:
    import pandas as pd

    if not Path(path).exists():
        raise FileNotFoundError(f"table not found: {path}")
    if Path(path).is_dir():
        raise ConfigError(f"{path} is a folder, not a table")
    try:
        return pd.read_csv(path, keep_default_na=True)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a UTF-8 CSV table (byte {exc.start})") from exc
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ConfigError(f"{path}: not a CSV table ({' '.join(str(exc).split())})") from exc


def resolve_path(value: str | os.PathLike[str], root: Path | None) -> Path:
    """A path from a card or params, relative to the repository root unless absolute."""
    p = Path(value).expanduser()
    return p if p.is_absolute() or root is None else Path(root) / p
