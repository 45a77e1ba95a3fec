"""Init in PyTorch RNG order, checked against draws made here from a fresh generator."""

import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest
import torch

from gpt2.config import GPTConfig
from gpt2.init import residual_projection_std
from gpt2.model import GPT

SMALL = GPTConfig(n_layer=3, n_head=2, n_embd=16, block_size=24, vocab_size=100, padded_vocab_size=128)


def _expected_state(config: GPTConfig, seed: int) -> dict[str, torch.Tensor]:
    """The documented order (docs/reference.md), drawn into fresh tensors: wte (real rows), wpe, then per layer qkv, attn proj, fc, mlp proj."""
    g = torch.Generator().manual_seed(seed)
    C, L = config.n_embd, config.n_layer
    # float32 C arithmetic: sqrtf, divide, multiply, each rounded to float32
    resid = float(np.float32(0.02) * (np.float32(1) / np.float32(math.sqrt(2 * L))))

    def normal(*shape, std=0.02):
        return torch.empty(*shape).normal_(0.0, std, generator=g)

    wte = torch.zeros(config.padded_vocab_size, C)
    wte[: config.vocab_size] = normal(config.vocab_size, C)
    state = {"transformer.wte.weight": wte, "transformer.wpe.weight": normal(config.block_size, C)}
    for l in range(L):
        p = f"transformer.h.{l}."
        state[p + "attn.c_attn.weight"] = normal(3 * C, C)
        state[p + "attn.c_proj.weight"] = normal(C, C, std=resid)
        state[p + "mlp.c_fc.weight"] = normal(4 * C, C)
        state[p + "mlp.c_proj.weight"] = normal(C, 4 * C, std=resid)
        for ln in ("ln_1", "ln_2"):
            state[p + ln + ".weight"] = torch.ones(C)
            state[p + ln + ".bias"] = torch.zeros(C)
        state[p + "attn.c_attn.bias"] = torch.zeros(3 * C)
        state[p + "attn.c_proj.bias"] = torch.zeros(C)
        state[p + "mlp.c_fc.bias"] = torch.zeros(4 * C)
        state[p + "mlp.c_proj.bias"] = torch.zeros(C)
    state["transformer.ln_f.weight"] = torch.ones(C)
    state["transformer.ln_f.bias"] = torch.zeros(C)
    state["lm_head.weight"] = wte
    return state


@pytest.mark.parametrize("seed", [42, 7])
def test_init_matches_documented_draw_order_bit_for_bit(seed):
    model = GPT.create(SMALL, seed=seed)
    expected = _expected_state(SMALL, seed)
    got = model.state_dict()
    assert set(got) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name


def test_residual_std_is_float32_arithmetic_one_ulp_off_double_for_L6_and_L24():
    for L in (6, 24):
        f32 = residual_projection_std(L)
        assert f32 == float(np.float32(0.02) * (np.float32(1) / np.float32(math.sqrt(2 * L))))
        # the Python double expression, rounded to float32, lands one float32 ulp away
        double = np.float32(0.02 * (1 / math.sqrt(2 * L)))
        assert abs(int(np.float32(f32).view(np.int32)) - int(double.view(np.int32))) == 1
    assert residual_projection_std(12) == float(np.float32(0.02 * (1 / math.sqrt(24))))


def test_init_is_identical_across_processes_and_ignores_global_rng():
    torch.manual_seed(123)  # the global RNG must not matter
    here = GPT.create(SMALL, seed=42).state_dict()
    code = (
        "import torch, sys; from gpt2.model import GPT; from gpt2.config import GPTConfig;"
        "m = GPT.create(GPTConfig(3, 2, 16, 24, 100, 128), seed=42);"
        "torch.save(m.state_dict(), sys.argv[1])"
    )
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "state.pt")
        subprocess.run([sys.executable, "-c", code, out], check=True)
        there = torch.load(out)
    for name in here:
        assert torch.equal(here[name], there[name]), name


def test_d12_init_statistics():
    model = GPT.create(GPTConfig.from_descriptor("d12"), seed=42)
    wte = model.transformer.wte.weight
    assert torch.count_nonzero(wte[50257:]) == 0
    assert abs(wte[:50257].std().item() - 0.02) < 1e-4
    proj = model.transformer.h[0].mlp.c_proj.weight
    assert abs(proj.std().item() - 0.02 / math.sqrt(24)) < 1e-4
