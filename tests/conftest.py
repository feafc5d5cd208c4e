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
