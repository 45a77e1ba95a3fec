"""Weight init in PyTorch RNG order: the same seed gives the same tensors as llm.c's train_gpt2.py.

One dedicated CPU generator, float32 `normal_` draws in module-registration order:
wte (real vocab rows only), wpe, then per layer c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj.
The two projections back into the residual stream use std 0.02 / sqrt(2L), computed in float32 as
llm.c's C code does (for L = 6 and 24 it differs from the Python double expression by one ulp).
LayerNorm weights are 1, biases and the padding rows of wte are 0, the tied lm_head is not drawn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn as nn

if TYPE_CHECKING:  # gpt2.model imports this module
    from gpt2.model import GPT

INIT_STD = 0.02


def residual_projection_std(n_layer: int) -> float:
    """0.02 * (1 / sqrt(2L)) in float32 arithmetic (sqrtf, then the division, then the product)."""
    scale = np.float32(1.0) / np.sqrt(np.float32(2 * n_layer), dtype=np.float32)
    return float(np.float32(INIT_STD) * scale)


@torch.no_grad()
def init_weights(model: GPT, seed: int = 42) -> None:
    """Overwrite every parameter of `model` (on the CPU) with llm.c's init for `seed`."""
    config = model.config
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def draw(weight: torch.Tensor, std: float) -> None:
        weight.normal_(mean=0.0, std=std, generator=generator)

    wte = model.transformer.wte.weight
    wte.zero_()  # padding rows stay 0
    draw(wte[: config.vocab_size], INIT_STD)  # a contiguous view: same stream as a (V, C) tensor
    draw(model.transformer.wpe.weight, INIT_STD)
    residual_std = residual_projection_std(config.n_layer)
    for block in model.transformer.h:
        draw(block.attn.c_attn.weight, INIT_STD)
        draw(block.attn.c_proj.weight, residual_std)
        draw(block.mlp.c_fc.weight, INIT_STD)
        draw(block.mlp.c_proj.weight, residual_std)
        for linear in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj):
            linear.bias.zero_()
    for module in model.modules():
        if isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
