"""Great Expectations gates: a table either passes its suite or the stage stops.

Suites are built from plain expectation objects; `validate_table` runs them on a
DataFrame in an ephemeral context and `require_valid` raises ValidationFailed with
a readable summary (which expectation, which column, how many rows, examples).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

import pandas as pd

from voicebias.errors import VoicebiasError

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")


class ValidationFailed(VoicebiasError, RuntimeError):
    """A data gate failed; the message lists every failed expectation."""


@dataclass
class ValidationReport:
    suite: str
    success: bool
    n_rows: int
    failures: list[dict[str, Any]] = field(default_factory=list)
    n_expectations: int = 0

    def summary(self) -> str:
        head = (
            f"suite '{self.suite}': {len(self.failures)} of {self.n_expectations} expectations failed"
            f" on {self.n_rows} rows"
        )
        lines = [head]
        for f in self.failures:
            col = f" column '{f['column']}'" if f.get("column") else ""
            count = f" ({f['unexpected_count']} rows)" if f.get("unexpected_count") is not None else ""
            ex = f"; e.g. {f['examples']}" if f.get("examples") else ""
            obs = f"; observed {f['observed']}" if f.get("observed") is not None else ""
            lines.append(f"  - {f['expectation']}{col}{count}{obs}{ex}")
        return "\n".join(lines)


#: Modules Great Expectations imports when it is imported but uses only in expectations
#: voicebias never calls (distribution tests, KL divergence): loaded on first use instead
#: (`_deferred`), which keeps about 0.7 s out of every stage that validates a table and does
#: not use scipy.stats itself.
DEFERRED_BY_GX = ("scipy.stats",)


def _deferred(name: str) -> None:
    """Put `name` in sys.modules as a module that loads itself on first attribute access
    (importlib.util.LazyLoader); nothing happens if it is already imported or not installed."""
    import importlib.util
    import sys

    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        return
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)


def _gx():
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    for name in DEFERRED_BY_GX:
        _deferred(name)
    import great_expectations as gx

    return gx


def validate_table(df: pd.DataFrame, suite_name: str, expectations: Iterable[Any]) -> ValidationReport:
    """Run expectation objects (great_expectations.expectations.*) on a DataFrame."""
    gx = _gx()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas(name=f"{suite_name}_source")
    asset = source.add_dataframe_asset(name=suite_name)
    batch_def = asset.add_batch_definition_whole_dataframe(f"{suite_name}_all")
    batch = batch_def.get_batch(batch_parameters={"dataframe": df})
    suite = context.suites.add(gx.ExpectationSuite(name=suite_name))
    exps = list(expectations)
    for e in exps:
        suite.add_expectation(e)
    result = batch.validate(suite, result_format="SUMMARY")
    failures = []
    for r in result.results:
        if r.success:
            continue
        cfg = r.expectation_config
        res = r.result or {}
        failures.append(
            {
                "expectation": cfg.type,
                "column": cfg.kwargs.get("column") or cfg.kwargs.get("column_list"),
                "unexpected_count": res.get("unexpected_count"),
                "observed": res.get("observed_value"),
                "examples": (res.get("partial_unexpected_list") or [])[:5],
                "error": (r.exception_info or {}).get("exception_message") if r.exception_info else None,
            }
        )
    return ValidationReport(suite_name, bool(result.success), len(df), failures, len(exps))


def require_valid(df: pd.DataFrame, suite_name: str, expectations: Iterable[Any]) -> ValidationReport:
    report = validate_table(df, suite_name, expectations)
    if not report.success:
        raise ValidationFailed(report.summary())
    return report


def expectations():
    """The great_expectations.expectations module (imported lazily: ~4 s)."""
    return _gx().expectations


def where(column: str, value: Any):
    """Row condition 'column == value' for an expectation's row_condition."""
    from great_expectations.expectations.row_conditions import Column

    return Column(column) == value
