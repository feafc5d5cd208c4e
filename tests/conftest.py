import os

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")


import pytest  # noqa: E402

# the `server` fixture (a process on 127.0.0.1, stopped after its test) for every test module
from tests.support.servers import server  # noqa: E402, F401

E2E_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e")
E2E_TIMEOUT_S = 2700  # the scratch-clone fixtures run the reduced pipeline


def pytest_configure(config):
    """Each pytest-xdist worker has one core to itself: its BLAS runs on one thread, as the
    product's own worker processes do (voicebias.parallel.one_thread_per_worker). Two OpenBLAS
    threads per worker only contend with the other worker (numerical tests ran 3 to 9 times
    slower). Subprocesses (the pipeline runs of tests/e2e) keep the library's default."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import numpy  # noqa: F401  (load NumPy's and SciPy's BLAS, so the limit reaches both)
        import scipy.linalg  # noqa: F401
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With pytest-xdist (-n), one worker runs every end-to-end test (they share one scratch pipeline
    run, built once per worker that needs it), sent first as the longest unit, while the other
    workers take the unit-test modules."""
    from xdist.scheduler import LoadScopeScheduling

    class EndToEndTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "tests/e2e" if nodeid.startswith("tests/e2e/") else super()._split_scope(nodeid)

    return EndToEndTogether(config, log)


def pytest_collection_modifyitems(config, items):
    """Tests under tests/e2e carry the e2e marker and the longer per-test timeout; slow
    simulation studies run only when the -m expression names them (pytest -m slow)."""
    for item in items:
        if str(item.fspath).startswith(E2E_DIR + os.sep):
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))
    if "slow" not in (config.option.markexpr or ""):
        slow = [item for item in items if item.get_closest_marker("slow")]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.fixture(scope="session")
def workspace(tmp_path_factory):
    """(base folder, repository, repro result) of a scratch clone after `dvc repro` on the reduced
    profile, from empty caches with another processor's kernels played."""
    from tests.support.workspace import make_workspace, played_machine

    return make_workspace(tmp_path_factory, played_machine())


@pytest.fixture(scope="session")
def hostile(workspace):
    """(clone, repro result, hashes before): the workspace with the misbehaving reference system added."""
    from tests.support.workspace import make_hostile

    base, repo, _ = workspace
    return make_hostile(base, repo)


def _drop_modules_that_cannot_load() -> None:
    """Hypothesis reads `__file__` of every module in sys.modules before a property test; SpeechBrain
    puts lazy placeholders there for optional integrations (k2), which raise ImportError when touched
    and the integration is not installed. Such placeholders are removed before a property test runs."""
    import sys

    for name, module in list(sys.modules.items()):
        try:
            getattr(module, "__file__", None)
        except ImportError:
            del sys.modules[name]


def pytest_runtest_setup(item):
    if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
        _drop_modules_that_cannot_load()
