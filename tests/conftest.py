import os

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "1")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def workspace(tmp_path_factory):
    """(base folder, repository, repro result) of a scratch clone after `dvc repro`."""
    from tests.workspace import make_workspace

    return make_workspace(tmp_path_factory)


@pytest.fixture(scope="session")
def fresh_clone(workspace):
    """(clone, repro result, seconds): a fresh clone of the workspace's reproduced commit after `dvc repro`."""
    from tests.workspace import make_fresh_clone

    base, repo, _ = workspace
    return make_fresh_clone(base, repo)
