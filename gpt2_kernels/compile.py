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

`tag_compile_caches` (run when the package is imported) keeps torch.compile's on-disk caches from serving one
version of these ops' graphs to another.
"""

from __future__ import annotations

import functools
import hashlib
import warnings
from pathlib import Path

import torch

# registered when gpt2_kernels/__init__.py imported gpt2_kernels.attention, .mlp, .cross_entropy, .layernorm and .linear, which
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


def tag_compile_caches() -> None:
    """Put a digest of this package's sources into torch.compile's cache keys (idempotent).

    Inductor's and AOTAutograd's on-disk caches key a compiled graph on the traced model, not on the Python of
    the custom ops in it: a backward graph compiled with one version of an op's fake kernel is served to a
    version whose op returns another layout, which then stops at the first backward (`assert_size_stride`:
    seen when c_attn's and c_fc's weight gradients kept their GEMM's row stride, on a machine that had compiled
    the version before, either way round). `torch.compiler.config.cache_key_tag` is part of every key (a tag
    the user set stays in front); torch versions without it are left as they are."""
    config = torch.compiler.config
    if not hasattr(config, "cache_key_tag"):
        return
    ours = f"gpt2_kernels:{source_digest(Path(__file__).parent)}"
    if ours not in config.cache_key_tag:
        config.cache_key_tag = f"{config.cache_key_tag}|{ours}" if config.cache_key_tag else ours


@functools.cache
def source_digest(folder: Path) -> str:
    """sha256 of the Python files in `folder` (names and contents, in name order), 16 hex digits."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]
