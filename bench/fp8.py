"""FP8 matmuls for the blocks' linear layers, through torchao's float8 training: the benchmark's
`kernels-fp8` and `plain-fp8` variants and the numerics check's `--check kernels-fp8` path.

Not a training setting: measured on one H100 at d24 and d48, FP8 was slower at d24 and 2% faster at d48,
where its numerics check did not pass (bench/reports/2026-11-24-h100-d12-round3.md, "FP8 matmuls at d24 and d48").

`convert_blocks_to_fp8(model)` swaps every nn.Linear inside the transformer blocks (c_attn, attn.c_proj,
c_fc, mlp.c_proj) for torchao's Float8Linear with its default recipe, dynamic tensorwise scaling: each
matmul casts its inputs to float8 (activations and weights e4m3, output gradients e5m2) with one scale
per tensor from that tensor's absolute maximum, and runs `torch._scaled_mm`, whose every dimension must
be a multiple of 16 (n_embd and B x T here). The parameters stay the same tensors, so the optimizer is
unchanged. The classifier stays in bf16: it is tied to the token embedding, and its logits set the loss.

Both paths of gpt2/model.py reach the swapped layers: the plain one calls every linear as a module, and
the fused one does too once they are swapped (`gpt2.model.project`; quack's MLP GEMMs step aside then).
"""

from __future__ import annotations

import torch.nn as nn


def convert_blocks_to_fp8(model: nn.Module) -> int:
    """Swap the linear layers of `model.transformer.h` for torchao's Float8Linear (in place); returns how
    many were swapped. Call it before torch.compile and before the optimizer is built."""
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        raise ImportError("the FP8 variants need torchao: pip install torchao") from e
    blocks = model.transformer.h
    before = sum(type(m) is nn.Linear for m in blocks.modules())
    convert_to_float8_training(blocks, config=Float8LinearConfig())
    return before - sum(type(m) is nn.Linear for m in blocks.modules())
