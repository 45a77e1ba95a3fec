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
