"""Optional import of quack-kernels (the `gpu` extra: CuTe-DSL GEMMs with programmable epilogues).

Shared by the kernel modules that use it (gpt2_kernels/mlp.py, gpt2_kernels/cross_entropy.py): each asks here
once, then imports the quack parts it needs.
"""

from __future__ import annotations

import functools
import logging

import torch


@functools.cache
def quack_capability() -> tuple[int, int] | None:
    """The GPU's compute capability where quack imports and the GPU is a Hopper or newer, else None
    (asked only once quack imports: a machine without it may have no GPU at all)."""
    try:
        import quack  # noqa: F401
    except ImportError:
        return None
    capability = torch.cuda.get_device_capability()
    if capability[0] < 9:
        return None
    # quack 0.6.5 keys its compile cache on everything an epilogue's code refers to and refuses what it
    # cannot fingerprint; with nvidia-cutlass-dsl 4.7 that includes cutlass's logger, which changes no math.
    # Its epilogue library fingerprints on import, hence the key before any quack module past the root.
    logging.Logger.__quack_semantic_key__ = lambda self: ("logging.Logger", self.name)
    return capability


# A quack path's startup check fails above this relative error against its fp32 reference (bf16 lands near 3e-3)
CHECK_TOLERANCE = 5e-2


def max_relative_error(pairs) -> float:
    """Largest ‖a − b‖ / ‖b‖ over (result, fp32 reference) pairs: what the startup checks compare."""
    return max(float((a.float() - b).norm() / b.norm()) for a, b in pairs)
