"""Small, deterministic writers for tables and metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

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


def read_json(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def write_table(path: Path, df: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False, float_format="%.10g", lineterminator="\n")


def read_table(path: Path) -> pd.DataFrame:
    if not Path(path).exists():
        raise FileNotFoundError(f"table not found: {path}")
    return pd.read_csv(path, keep_default_na=True)
