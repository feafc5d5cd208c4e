"""The Examples sections of the statistics modules run as doctests, so they cannot rot, and every
public statistics function documents its parameters, its returns and an example."""

from __future__ import annotations

import doctest
import inspect

import pytest

from voicebias.analysis import emm, intervals, mixed, sc_stats, stats

MODULES = [stats, sc_stats, mixed, emm, intervals]
FLAGS = doctest.NORMALIZE_WHITESPACE


def public_functions(module):
    return [
        f
        for name, f in inspect.getmembers(module, inspect.isfunction)
        if not name.startswith("_") and f.__module__ == module.__name__
    ]


def example_tests(module):
    finder = doctest.DocTestFinder()
    return [t for t in finder.find(module, module.__name__, globs=vars(module).copy()) if t.examples]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_public_function_has_parameters_returns_and_examples(module):
    funcs = public_functions(module)
    assert len(funcs) >= 3
    for f in funcs:
        doc = inspect.getdoc(f) or ""
        for section in ("Parameters\n----------", "Returns\n-------", "Examples\n--------"):
            assert section in doc, f"{module.__name__}.{f.__name__}: no {section.splitlines()[0]} section"
        assert ">>> " in doc.split("Examples\n--------")[1], f"{f.__name__}: Examples without a doctest"


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples_run_and_print_what_they_show(module):
    tests = {t.name.rsplit(".", 1)[-1]: t for t in example_tests(module)}
    assert {f.__name__ for f in public_functions(module)} <= set(tests)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for name, t in tests.items():
        result = runner.run(t, out=lambda s: print(s, end=""))
        assert result.failed == 0, f"{module.__name__}.{name}: {result.failed} of {result.attempted} examples failed"
    assert runner.summarize(verbose=False).attempted >= len(tests)


def test_a_wrong_example_output_is_caught():
    t = doctest.DocTestParser().get_doctest(
        ">>> cell_type('neutral', 'male')\n'aligned'\n", vars(stats).copy(), "wrong", None, 0
    )
    assert doctest.DocTestRunner(optionflags=FLAGS).run(t, out=lambda s: None).failed == 1
