"""Fused GPU kernels for GPT-2 training, each beside its pure-PyTorch reference.

Every op is a `torch.library.custom_op` with a fake (meta) implementation and a registered autograd
formula, so torch.compile keeps it as one opaque node and compiles everything around it. Each op runs
its Triton kernel on CUDA (or on CPU under TRITON_INTERPRET=1) and its PyTorch reference elsewhere,
so this package imports and works without Triton or a GPU.

- `linear_cross_entropy`: lm_head matmul + softmax cross-entropy + gradients over row chunks.
- `add_layernorm`: residual add + LayerNorm, forward and backward.
- `configure_sdpa`: pick and pin a checked scaled_dot_product_attention backend (cuDNN, flash).
"""

from kernels.attention import configure_sdpa
from kernels.cross_entropy import linear_cross_entropy, linear_cross_entropy_reference
from kernels.layernorm import add_layernorm, add_layernorm_reference

__all__ = [
    "add_layernorm",
    "add_layernorm_reference",
    "configure_sdpa",
    "linear_cross_entropy",
    "linear_cross_entropy_reference",
]
