"""Optional Triton import shared by the kernel modules.

Kernel modules must import on machines without Triton (CPU-only CI images, macOS): there the ops run
their pure-PyTorch references instead. Triton runs either on CUDA tensors or, with
`TRITON_INTERPRET=1` (set by tests/conftest.py on CPU machines), on CPU tensors through its interpreter.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # kernels are then never launched; `tl.constexpr` only has to exist for annotations
    triton = None
    tl = SimpleNamespace(constexpr=None)


def jit(fn):
    """`triton.jit` when Triton is installed; otherwise the plain function, which is never called."""
    return triton.jit(fn) if triton is not None else fn


def use_triton(t: torch.Tensor) -> bool:
    """Whether a Triton kernel can run on `t`: on CUDA, or on CPU under Triton's interpreter."""
    if triton is None:
        return False
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def num_sms(device: torch.device) -> int:
    """Multiprocessors to size persistent grids by; a small fixed count on the CPU interpreter."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2

