"""Register the kernels' custom ops with torch.compile's Inductor up front.

Inductor lowers an op it has no lowering for through an "implicit fallback", and torch 2.11 formats
a description of the op's arguments while doing so, even with logging off. An argument's
description recursively includes every extern kernel it was computed from, and each fused
LayerNorm consumes two outputs of the one before it, so the string for the fused classifier at the
end of the chain grows about 4.4x per layer (measured on CPU, torch 2.13 with INFO logs: 0.27, 1.2,
5.2, 23, 98 MB of log for 1..5 layers). For d12 that never finishes: compiling ran for more than 8
minutes (H200, torch 2.11, 2026-11-21) inside that formatting. torch 2.13 builds the string only
when logging asks for it. Registering the same fallback the implicit path would create (with its
layout constraint: keep the strides the graph traced) skips that path on every version. This uses
Inductor's internal `make_fallback`; if it moves, a warning says so.
"""

from __future__ import annotations

import warnings

import torch

# registered when kernels/__init__.py imported kernels.attention, .mlp, .cross_entropy, .layernorm and .linear, which
# Python does before it runs this submodule
_OPS = (
    torch.ops.gpt2_kernels.linear_cross_entropy.default,
    torch.ops.gpt2_kernels.add_layernorm_fwd.default,
    torch.ops.gpt2_kernels.add_layernorm_bwd.default,
    torch.ops.gpt2_kernels.attention_fwd.default,
    torch.ops.gpt2_kernels.attention_bwd.default,
    torch.ops.gpt2_kernels.mlp_fwd.default,
    torch.ops.gpt2_kernels.mlp_bwd.default,
    torch.ops.gpt2_kernels.biased_linear.default,
    torch.ops.gpt2_kernels.biased_linear_bwd.default,
)


def register_inductor_fallbacks() -> None:
    """Idempotent; call before torch.compile traces a model that uses these ops (GPT does, when built
    with use_kernels=True). Importing Inductor takes a few seconds, hence not at package import."""
    try:
        from torch._inductor.lowering import constrain_to_fx_strides, lowerings, make_fallback
    except ImportError as e:
        warnings.warn(f"torch.compile of the fused path may stall: cannot register Inductor fallbacks ({e})")
        return
    for op in _OPS:
        if op not in lowerings:
            make_fallback(op, layout_constraint=constrain_to_fx_strides, warn=False)
