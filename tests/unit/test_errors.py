"""The exception hierarchy and `guarded`: expected failures print one line, bugs keep their traceback."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
import textwrap

import pytest

import voicebias
from voicebias.errors import ConfigError, NotFound, VoicebiasError, guarded

# modules that run in another environment or need optional heavy packages to import
SKIP = ("voicebias.stimuli.phonation.external", "voicebias.systems.drivers", "voicebias.serving.shim")


def package_modules() -> list[str]:
    return sorted(
        m.name for m in pkgutil.walk_packages(voicebias.__path__, "voicebias.") if not m.name.startswith(SKIP)
    )


def test_every_exception_class_of_the_package_subclasses_voicebias_error():
    classes = {}
    for name in package_modules():
        module = importlib.import_module(name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == name:
                classes[f"{name}.{obj.__qualname__}"] = obj
    assert {
        "voicebias.params.ParamsError",
        "voicebias.errors.SetupError",
        "voicebias.audio.AudioError",
        "voicebias.instruments.judge.JudgeCallError",
        "voicebias.validation.ValidationFailed",
    } <= set(classes)
    assert [n for n, c in classes.items() if not issubclass(c, VoicebiasError)] == []


def test_project_errors_keep_their_builtin_base():
    from voicebias.audio import AudioError
    from voicebias.errors import SetupError, TransientError
    from voicebias.params import ParamsError
    from voicebias.tts.kokoro import KokoroWeightsMissing

    assert issubclass(ParamsError, ValueError) and issubclass(AudioError, ValueError)
    assert issubclass(SetupError, RuntimeError) and issubclass(TransientError, RuntimeError)
    assert issubclass(KokoroWeightsMissing, FileNotFoundError)
    assert TransientError("slow down", retry_after_s=2.0).retry_after_s == 2.0


def test_guarded_prints_one_line_and_exits_1_on_an_expected_failure(capsys, monkeypatch):
    monkeypatch.delenv("VOICEBIAS_DEBUG", raising=False)

    def fails():
        raise ConfigError("tts.rate_wpm must be positive")

    with pytest.raises(SystemExit) as exc:
        guarded(fails, stage="stimuli")
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err == "voicebias stimuli: tts.rate_wpm must be positive\n"
    with pytest.raises(SystemExit):
        guarded(lambda: (_ for _ in ()).throw(NotFound("no voice 'x'")), stage="s")
    assert capsys.readouterr().err == "voicebias s: no voice 'x'\n"
    with pytest.raises(SystemExit):
        guarded(lambda: open("/nonexistent/voicebias/file"), stage="s")
    assert "No such file" in capsys.readouterr().err


def test_guarded_lets_a_plain_keyerror_from_a_bug_propagate(monkeypatch):
    monkeypatch.delenv("VOICEBIAS_DEBUG", raising=False)

    def buggy():
        return {}["missing"]

    with pytest.raises(KeyError) as exc:
        guarded(buggy, stage="x")
    assert exc.traceback[-1].name == "buggy"  # the traceback still points at the bug
    with pytest.raises(ValueError):
        guarded(int, "not a number", stage="x")


def _run(code: str, env_debug: str | None) -> subprocess.CompletedProcess:
    import os

    env = {k: v for k, v in os.environ.items() if k != "VOICEBIAS_DEBUG"}
    if env_debug is not None:
        env["VOICEBIAS_DEBUG"] = env_debug
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)


def test_voicebias_debug_prints_the_traceback():
    code = """
        from voicebias.errors import guarded
        from voicebias.errors import StageFailed
        def deep_inside():
            raise StageFailed("2 conversion(s) failed")
        guarded(deep_inside, stage="phonation")
    """
    quiet = _run(code, None)
    assert quiet.returncode == 1
    assert quiet.stderr.strip() == "voicebias phonation: 2 conversion(s) failed"
    loud = _run(code, "1")
    assert loud.returncode == 1
    assert "Traceback (most recent call last)" in loud.stderr and "deep_inside" in loud.stderr
    assert loud.stderr.rstrip().endswith("voicebias phonation: 2 conversion(s) failed")
