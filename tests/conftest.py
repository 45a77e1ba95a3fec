"""Shared test set-up.

Without a GPU, Triton kernels run on CPU tensors through Triton's interpreter. The variable is read
when a kernel is decorated, so it is set here, before any test module imports `kernels`.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """A temporary Prefect server for one test module; yields a fresh folder, which also holds the results."""
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    root = tmp_path_factory.mktemp("pipeline")
    with prefect_test_harness(server_startup_timeout=180), \
            temporary_settings({PREFECT_LOCAL_STORAGE_PATH: root / "results"}):
        yield root
