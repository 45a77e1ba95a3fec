"""Causal attention for the fused path: a checked SDPA backend, and cuDNN forward + FlashAttention-4 backward.

SDPA silently falls back to slower backends when the preferred one rejects a shape or dtype, so the
fused path does not rely on its default order: `configure_sdpa` tries the candidates in order on the
model's head shape, keeps the first one that runs forward and backward and agrees with the math
backend, and then enables only that one (plus nothing to fall back to), so a later shape it cannot
serve raises instead of silently running the math backend. On H100 cuDNN's fused attention is
usually the fastest for head size 64; FlashAttention-2 is the next candidate.

`causal_attention(qkv, n_head)` is the fused path's attention on the packed (B, T, 3C) projection. Where
`configure_attention` found FlashAttention-4 (the optional `flash-attn-4` package, Hopper and newer) it
runs one custom op: cuDNN's forward (the fastest forward measured at head size 64) and FA4's backward,
which is faster than cuDNN's and writes dq, dk and dv straight into one (B, T, 3C) gradient, so the
concatenation pass SDPA's backward needs is gone (d12 on H100: 1.16 against 1.62 ms per layer and
micro-step, docs/benchmarks.md). Elsewhere on CUDA it is SDPA with the pinned backend. On CPU the op
runs its PyTorch reference (`attention_reference_*`, FlashAttention's backward formulas written out), so
the op's wiring is tested without a GPU.
"""

from __future__ import annotations

import functools
import math

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


# Whether the fused model runs causal_attention (cuDNN forward + FA4 backward) on CUDA; set by
# configure_attention before a model is compiled (compiled graphs bake the choice in, like the SDPA backend)
_fa4_backward_on_cuda = False


def configure_attention(n_head: int, head_size: int, dtype: torch.dtype = torch.bfloat16,
                        device: torch.device | str = "cuda", fa4_backward: bool = True,
                        preference: tuple[str, ...] = DEFAULT_PREFERENCE) -> str:
    """`configure_sdpa`, then the FA4 backward where SDPA picked cuDNN and flash-attn-4 is installed and
    agrees with the fp32 reference on the model's head shape. Returns what runs, e.g. "cudnn+fa4-bwd"."""
    global _fa4_backward_on_cuda
    name = configure_sdpa(n_head, head_size, dtype=dtype, device=device, preference=preference)
    _fa4_backward_on_cuda = False
    if not (fa4_backward and name == "cudnn" and dtype in (torch.bfloat16, torch.float16)
            and _load_fa4_backward() is not None):
        return name
    g = torch.Generator(device=device).manual_seed(0)
    qkv = torch.randn(2, 256, 3 * n_head * head_size, device=device, dtype=dtype, generator=g)
    dy = torch.randn(2, 256, n_head * head_size, device=device, dtype=dtype, generator=g)
    y, lse = _attention_fwd(qkv, n_head)
    ref_y, ref_lse = attention_reference_fwd(qkv.float(), n_head)
    dqkv = _attention_bwd(dy, qkv, y, lse, n_head)
    ref_dqkv = attention_reference_bwd(dy.float(), qkv.float(), ref_y, ref_lse, n_head)
    err = max(float((a.float() - b).norm() / b.norm()) for a, b in ((y, ref_y), (dqkv, ref_dqkv)))
    if err > 5e-2:  # bf16 lands near 3e-3 (see backend_error)
        raise RuntimeError(f"flash-attn-4's backward disagrees with the reference on head size {head_size}: "
                           f"relative error {err:.2e}; `pip uninstall flash-attn-4 quack-kernels` (the gpu "
                           "extra) to train without it")
    _fa4_backward_on_cuda = True
    return name + "+fa4-bwd"


@functools.cache
def _load_fa4_backward():
    """FlashAttention-4's backward entry point, or None where it is not installed or the GPU predates
    Hopper. Its import takes seconds (CuTe DSL), hence on first use only."""
    try:
        from flash_attn.cute.interface import _flash_attn_bwd
    except ImportError:
        return None
    return _flash_attn_bwd if torch.cuda.get_device_capability()[0] >= 9 else None


def packed_attention_enabled(device: torch.device) -> bool:
    """Whether the fused model runs `causal_attention` on `device` (always on CPU: the reference);
    elsewhere it runs SDPA with the pinned backend."""
    return device.type == "cpu" or (device.type == "cuda" and _fa4_backward_on_cuda)


def causal_attention(qkv: torch.Tensor, n_head: int) -> torch.Tensor:
    """qkv (B, T, 3C), the c_attn output (q, k, v side by side) -> causal self-attention (B, T, C)."""
    return _attention_fwd(qkv, n_head)[0]


def _split_heads(qkv: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T, 3C) -> q, k, v, each a (B, nh, T, hs) view of it."""
    B, T, C3 = qkv.shape
    C = C3 // 3
    return tuple(t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in qkv.split(C, dim=2))


@torch.library.custom_op("gpt2_kernels::attention_fwd", mutates_args=())
def _attention_fwd(qkv: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """qkv (B, T, 3C) -> (y (B, T, C), lse (B, nh, T) fp32: each query's log-sum-exp of scores)."""
    if not qkv.is_cuda:
        y, lse = attention_reference_fwd(qkv.float(), n_head)
        return y.to(qkv.dtype), lse
    B, T, _ = qkv.shape
    q, k, v = _split_heads(qkv, n_head)
    # cuDNN lays the output out as (B, T, nh, hs) in memory, so the transpose back is free
    out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False)[:2]
    return out.transpose(1, 2).reshape(B, T, -1), lse.reshape(B, n_head, T)


@_attention_fwd.register_fake
def _(qkv, n_head):
    B, T, C3 = qkv.shape
    return qkv.new_empty(B, T, C3 // 3), qkv.new_empty(B, n_head, T, dtype=torch.float32)


@torch.library.custom_op("gpt2_kernels::attention_bwd", mutates_args=())
def _attention_bwd(dy: torch.Tensor, qkv: torch.Tensor, y: torch.Tensor, lse: torch.Tensor,
                   n_head: int) -> torch.Tensor:
    """-> dqkv (B, T, 3C), the gradient of the packed projection."""
    if not qkv.is_cuda:
        return attention_reference_bwd(dy.float(), qkv.float(), y.float(), lse, n_head).to(qkv.dtype)
    B, T, C3 = qkv.shape
    hs = C3 // 3 // n_head
    q, k, v = qkv.view(B, T, 3, n_head, hs).unbind(2)  # (B, T, nh, hs) each, FA4's layout
    fa4_backward = _load_fa4_backward()
    if fa4_backward is None:
        raise RuntimeError("causal_attention's backward on CUDA needs flash-attn-4 on a Hopper or newer GPU "
                           "(see configure_attention); without it, use SDPA")
    dqkv = torch.empty_like(qkv)
    dq, dk, dv = dqkv.view(B, T, 3, n_head, hs).unbind(2)  # written in place: no concatenation
    # deterministic: the dq accumulation order is fixed, so a resumed run repeats bit for bit
    fa4_backward(q, k, v, y.view(B, T, n_head, hs), dy.reshape(B, T, n_head, hs), lse,
                         causal=True, deterministic=True, dq=dq, dk=dk, dv=dv)
    return dqkv


@_attention_bwd.register_fake
def _(dy, qkv, y, lse, n_head):
    return torch.empty_like(qkv)


def _setup_context(ctx, inputs, output):
    qkv, ctx.n_head = inputs
    y, lse = output
    ctx.save_for_backward(qkv, y, lse)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dy, _dlse):
    qkv, y, lse = ctx.saved_tensors
    return _attention_bwd(dy.contiguous(), qkv, y, lse, ctx.n_head), None


_attention_fwd.register_autograd(_backward, setup_context=_setup_context)


def _reference_scores(qkv: torch.Tensor, n_head: int):
    """q, k, v (B, nh, T, hs) and the causally masked, scaled scores (B, nh, T, T)."""
    q, k, v = _split_heads(qkv, n_head)
    T = qkv.size(1)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    future = torch.ones(T, T, dtype=torch.bool, device=qkv.device).triu(1)
    return q, k, v, scores.masked_fill(future, float("-inf"))


def attention_reference_fwd(qkv: torch.Tensor, n_head: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's forward in plain PyTorch, in qkv's dtype: (y (B, T, C), lse (B, nh, T))."""
    B, T, _ = qkv.shape
    _, _, v, scores = _reference_scores(qkv, n_head)
    lse = torch.logsumexp(scores, dim=-1)  # (B, nh, T)
    y = torch.exp(scores - lse[..., None]) @ v  # (B, nh, T, hs)
    return y.transpose(1, 2).reshape(B, T, -1), lse


def attention_reference_bwd(dy: torch.Tensor, qkv: torch.Tensor, y: torch.Tensor, lse: torch.Tensor,
                            n_head: int) -> torch.Tensor:
    """The op's backward in plain PyTorch: FlashAttention's formulas, the probabilities rebuilt from lse.

    dV = Pᵀ dO;  dS = P ∘ (dO Vᵀ − rowsum(dO ∘ O));  dQ = dS K / √hs;  dK = dSᵀ Q / √hs
    """
    B, T, C3 = qkv.shape
    q, k, v, scores = _reference_scores(qkv, n_head)
    p = torch.exp(scores - lse[..., None])  # (B, nh, T, T)
    do = dy.view(B, T, n_head, -1).transpose(1, 2)  # (B, nh, T, hs)
    o = y.view(B, T, n_head, -1).transpose(1, 2)  # (B, nh, T, hs)
    dv = p.transpose(-2, -1) @ do
    ds = p * (do @ v.transpose(-2, -1) - (do * o).sum(-1, keepdim=True))
    scale = 1.0 / math.sqrt(q.size(-1))
    dq, dk = ds @ k * scale, ds.transpose(-2, -1) @ q * scale
    return torch.cat([t.transpose(1, 2).reshape(B, T, C3 // 3) for t in (dq, dk, dv)], dim=2)  # (B, T, 3C)
