"""bench/fp8.py: the blocks' matmuls in FP8 through torchao's float8 training, on both model paths.

torchao's float8 matmul runs on CPU too (torch._scaled_mm), so the question "does the fused path reach
the swapped layers" is answered here: the fused path of a converted model must compute what the plain
path of the same converted model computes, and both must differ from bf16/fp32 arithmetic by FP8's
rounding (e4m3 keeps 3 mantissa bits), which an unconverted matmul would not show.
"""

import pytest
import torch
import torch.nn as nn

pytest.importorskip("torchao", reason="the FP8 measurement needs torchao: pip install -e '.[fp8]'")

from bench.fp8 import convert_blocks_to_fp8
from gpt2.config import GPTConfig
from gpt2.model import GPT
from tests.fixtures.numerics import rel_err

# every matmul dimension a multiple of 16, as torch._scaled_mm requires: n_embd 32, B x T = 2 x 16 rows
CONFIG = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=101, padded_vocab_size=128)


def batch():
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, CONFIG.vocab_size, (2, 16), generator=g)
    return idx, torch.randint(0, CONFIG.vocab_size, (2, 16), generator=g)


def loss_and_grads(model: GPT) -> tuple[float, dict[str, torch.Tensor]]:
    idx, targets = batch()
    _, loss = model(idx, targets, return_logits=False)
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_conversion_swaps_the_four_block_linears_and_keeps_the_parameters():
    model = GPT.create(CONFIG, seed=1)
    before = dict(model.named_parameters())
    assert convert_blocks_to_fp8(model) == 4 * CONFIG.n_layer
    after = dict(model.named_parameters())
    assert after.keys() == before.keys()  # checkpoints and model files see the same names
    assert all(after[name] is p for name, p in before.items())  # the optimizer's tensors, the same
    block = model.transformer.h[0]
    for linear in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj):
        assert type(linear) is not nn.Linear and isinstance(linear, nn.Linear)
    assert type(model.lm_head) is nn.Linear and model.lm_head.weight is model.transformer.wte.weight


def test_fused_path_reaches_the_fp8_matmuls():
    plain_fp8, fused_fp8, fused = (GPT.create(CONFIG, seed=1, use_kernels=k) for k in (False, True, True))
    convert_blocks_to_fp8(plain_fp8)
    convert_blocks_to_fp8(fused_fp8)
    loss_plain_fp8, grads_plain_fp8 = loss_and_grads(plain_fp8)
    loss_fused_fp8, grads_fused_fp8 = loss_and_grads(fused_fp8)
    loss_fused, grads_fused = loss_and_grads(fused)
    # the same FP8 arithmetic on both paths: only fp32 rounding apart
    assert abs(loss_fused_fp8 - loss_plain_fp8) < 1e-5 * loss_plain_fp8
    for name, g in grads_plain_fp8.items():
        assert rel_err(grads_fused_fp8[name], g) < 1e-4, name
    # and FP8's rounding is there: c_fc's gradient moves by about e4m3's resolution, not fp32's
    name = "transformer.h.0.mlp.c_fc.weight"
    assert rel_err(grads_fused_fp8[name], grads_fused[name]) > 1e-3
    assert loss_fused_fp8 != loss_fused
