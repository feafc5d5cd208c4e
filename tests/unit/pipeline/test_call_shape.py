"""One call shape for every stage: voicebias.pipeline.<stage>.run_stage takes the validated params
first and every path by keyword, and each module has that one entry point."""

from __future__ import annotations

import importlib
import inspect

import pytest

from voicebias import config

STAGE_MODULES = sorted(p.stem for p in (config.ROOT / "stages").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("stage", STAGE_MODULES)
def test_run_stage_takes_params_then_keywords_only(stage):
    fn = importlib.import_module(f"voicebias.pipeline.{stage}").run_stage
    params = list(inspect.signature(fn).parameters.values())
    positional = [p.name for p in params if p.kind is not p.KEYWORD_ONLY]
    assert positional in (["params"], []), f"{stage}.run_stage takes {positional} by position"
    assert any(p.kind is p.KEYWORD_ONLY for p in params)


@pytest.mark.parametrize("stage", STAGE_MODULES)
def test_each_stage_script_calls_its_pipeline_module_once(stage):
    text = (config.ROOT / "stages" / f"{stage}.py").read_text(encoding="utf-8")
    assert f"from voicebias.pipeline.{stage} import run_stage" in text
    assert text.count("run_stage,") == 1
