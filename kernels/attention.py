"""Causal attention through scaled_dot_product_attention, with the backend chosen and checked.

SDPA silently falls back to slower backends when the preferred one rejects a shape or dtype, so the
fused path does not rely on its default order: `configure_sdpa` tries the candidates in order on the
model's head shape, keeps the first one that runs forward and backward and agrees with the math
backend, and then enables only that one (plus nothing to fall back to), so a later shape it cannot
serve raises instead of silently running the math backend. On H100 cuDNN's fused attention is
usually the fastest for head size 64; FlashAttention-2 is the next candidate.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
_ENABLE = {
    "cudnn": torch.backends.cuda.enable_cudnn_sdp,
    "flash": torch.backends.cuda.enable_flash_sdp,
    "efficient": torch.backends.cuda.enable_mem_efficient_sdp,
    "math": torch.backends.cuda.enable_math_sdp,
}
DEFAULT_PREFERENCE = ("cudnn", "flash", "efficient")


def backend_error(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> float:
    """Relative error of backend `name` vs the fp32 math backend on causal attention, output and
    input gradients; raises RuntimeError if the backend cannot run these inputs."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel([BACKENDS[name]]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    with sdpa_kernel([SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(q32, k32, v32, is_causal=True)
    ref_grads = torch.autograd.grad(ref, (q32, k32, v32), dout.float())
    pairs = zip((out.detach(), *grads), (ref.detach(), *ref_grads))  # detached: no autograd warning in float()
    return max(float((a.float() - b).norm() / b.norm()) for a, b in pairs)


def enable_all_sdpa_backends() -> None:
    """PyTorch's default SDPA dispatch again (every backend enabled, its own order), e.g. after
    `configure_sdpa` pinned one."""
    for enable in _ENABLE.values():
        enable(True)


def configure_sdpa(
    n_head: int,
    head_size: int,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cuda",
    preference: tuple[str, ...] = DEFAULT_PREFERENCE,
    seq_len: int = 256,
    tolerance: float = 5e-2,
) -> str:
    """Enable exactly one CUDA SDPA backend: the first of `preference` that runs and is accurate.

    Call once before building/compiling the model (compiled graphs bake the backend in at trace time).
    Returns the backend's name. tolerance: relative L2 error vs fp32 math (bf16 inputs land near
    4e-3, a broken backend near 1).
    """
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(2, n_head, seq_len, head_size, device=device, dtype=dtype, generator=g)
               for _ in range(3))  # (B, nh, T, hs)
    failures = []
    for name in preference:
        try:
            err = backend_error(name, q, k, v)
        except RuntimeError as e:  # backend unavailable for this GPU/shape/dtype
            failures.append(f"{name}: {str(e).splitlines()[0]}")
            continue
        if err > tolerance:
            failures.append(f"{name}: relative error {err:.2e} > {tolerance:.0e}")
            continue
        for other, enable in _ENABLE.items():
            enable(other == name)
        return name
    raise RuntimeError(
        f"no SDPA backend of {preference} works for head_size={head_size} dtype={dtype}: " + "; ".join(failures)
    )
