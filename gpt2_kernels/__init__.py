"""Fused GPU kernels for GPT-2 training, each beside its pure-PyTorch reference.

Every op is a `torch.library.custom_op` with a fake (meta) implementation and a registered autograd
formula, so torch.compile keeps it as one opaque node and compiles everything around it. Each op runs
its Triton kernel on CUDA (or on CPU under TRITON_INTERPRET=1) and its PyTorch reference elsewhere,
so this package imports and works without Triton or a GPU.

- `linear_cross_entropy`: lm_head matmul + softmax cross-entropy + gradients over row chunks; with
  quack-kernels on a Hopper GPU, the softmax inside the logits GEMM's epilogue.
- `add_layernorm`: residual add + LayerNorm, forward and backward; its backward also gives the gradient of
  the c_proj bias that the branch's GEMM added (`bias_in_y`).
- `causal_attention`: attention on the packed q/k/v projection; with flash-attn-4 installed, cuDNN's
  forward and FlashAttention-4's backward writing one packed gradient.
- `fused_mlp`: GPT-2's MLP with the GELU inside the matmuls' epilogues (quack-kernels, where installed).
- `biased_linear` (c_attn): a linear layer whose bias gradient comes out of its weight-gradient GEMM,
  through a column of ones that `add_layernorm(..., ones_column=True)` writes beside its output; fused_mlp
  takes c_fc's bias gradient the same way (gpt2_kernels/linear.py). Their forward and input-gradient GEMMs run
  quack's GEMM at pinned tiles where the `gpu` extra is installed on a Hopper GPU (`configure_linear`), as
  does `projection` (attention's c_proj: its bias in the GEMM's epilogue, its bias gradient from add_layernorm).
- `stochastic_round` (gpt2_kernels/stochastic_round.py, not a custom op: the optimizer calls it outside any
  compiled graph): master weights rounded to bfloat16 values in one pass, the random bits drawn inside.
- `configure_kernels`: before a model is compiled, pick and pin a checked SDPA backend (cuDNN, flash)
  and turn on the optional FA4 backward, GELU-epilogue MLP, quack block GEMMs and scaled-exp classifier
  where they are installed and agree with their references (`configure_attention`, `configure_mlp`,
  `configure_linear`, `configure_classifier`, `configure_sdpa`: the parts alone).
"""

import torch

from gpt2_kernels.attention import DEFAULT_PREFERENCE, causal_attention, configure_attention, configure_sdpa
from gpt2_kernels.cross_entropy import configure_classifier, linear_cross_entropy, linear_cross_entropy_reference
from gpt2_kernels.layernorm import add_layernorm, add_layernorm_reference
from gpt2_kernels.linear import biased_linear, configure_linear, projection, with_ones_column
from gpt2_kernels.mlp import configure_mlp, fused_mlp
from gpt2_kernels.compile import tag_compile_caches  # after the ops' modules: it names their ops

tag_compile_caches()


def configure_kernels(n_head: int, head_size: int, dtype: torch.dtype = torch.bfloat16,
                      device: torch.device | str = "cuda", preference: tuple[str, ...] = DEFAULT_PREFERENCE,
                      fa4_backward: bool = True, gelu_epilogue: bool = True, scaled_exp_classifier: bool = True,
                      quack_gemm: bool = True, keep_mlp_post_bytes: float = 0.0) -> str:
    """Configure the fused path's attention, MLP, block GEMMs and classifier for this model shape; returns
    what runs, e.g. "cudnn+fa4-bwd, quack-gelu-epilogue, quack-gemm, quack-scaled-exp". keep_mlp_post_bytes:
    memory the MLPs may spend keeping their GELU output for backward (gpt2_kernels.mlp.layers_keeping_post)."""
    n_embd = n_head * head_size
    attention = configure_attention(n_head, head_size, dtype=dtype, device=device, preference=preference,
                                    fa4_backward=fa4_backward)
    mlp = configure_mlp(dtype, device, gelu_epilogue, n_embd=n_embd, keep_post_bytes=keep_mlp_post_bytes)
    linear = configure_linear(dtype, device, quack_gemm, n_embd=n_embd)
    classifier = configure_classifier(dtype, device, scaled_exp_classifier, n_embd=n_embd)
    return f"{attention}, {mlp}, {linear}, {classifier}"


__all__ = [
    "add_layernorm",
    "add_layernorm_reference",
    "biased_linear",
    "causal_attention",
    "configure_classifier",
    "configure_attention",
    "configure_kernels",
    "configure_linear",
    "configure_mlp",
    "configure_sdpa",
    "fused_mlp",
    "linear_cross_entropy",
    "linear_cross_entropy_reference",
    "projection",
    "with_ones_column",
]
