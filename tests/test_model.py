"""The model's shapes, padded vocabulary and input checks (descriptors: tests/test_config.py)."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gpt2.config import GPTConfig
from gpt2.model import GPT

TINY = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=32, vocab_size=50257)


def test_d12_parameter_count_matches_llmc():
    # by hand: padded wte + wpe + 12 layers of (2 LayerNorms, qkv, proj, fc, fcproj) + ln_f
    V, T, C, L = 50304, 1024, 768, 12
    per_layer = 2 * 2 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C)
    expected = V * C + T * C + L * per_layer + 2 * C
    assert expected == 124_475_904
    model = GPT.empty(GPTConfig.from_descriptor("d12"), device="meta")
    assert model.num_parameters() == expected


def test_lm_head_is_tied_and_padding_never_reaches_logits_or_loss():
    model = GPT.create(TINY, seed=0)
    assert model.lm_head.weight is model.transformer.wte.weight
    idx = torch.randint(0, TINY.vocab_size, (2, 7))
    logits, loss = model(idx, idx)
    assert logits.shape == (2, 7, TINY.vocab_size)
    # make the padding rows huge: nothing a caller sees may change
    with torch.no_grad():
        model.transformer.wte.weight[TINY.vocab_size :] = 1e4
    logits2, loss2 = model(idx, idx)
    torch.testing.assert_close(logits2, logits, rtol=0, atol=0)
    torch.testing.assert_close(loss2, loss, rtol=0, atol=0)


def test_loss_is_mean_cross_entropy_by_hand():
    model = GPT.create(TINY, seed=1)
    idx = torch.randint(0, TINY.vocab_size, (2, 5))
    targets = torch.randint(0, TINY.vocab_size, (2, 5))
    targets[0, 0] = -1  # ignored
    with torch.no_grad():
        logits, loss = model(idx, targets)
    logp = logits.double().log_softmax(-1)
    picked = [-logp[b, t, targets[b, t]] for b in range(2) for t in range(5) if targets[b, t] >= 0]
    assert math.isclose(loss.item(), float(sum(picked) / len(picked)), rel_tol=1e-6)


def test_return_logits_false_returns_only_the_loss():
    model = GPT.create(TINY, seed=0)
    idx = torch.randint(0, TINY.vocab_size, (1, 4))
    logits, loss = model(idx, idx, return_logits=False)
    assert logits is None and loss is not None


def test_attention_is_causal():
    model = GPT.create(TINY, seed=0)
    idx = torch.randint(0, TINY.vocab_size, (1, 10))
    changed = idx.clone()
    changed[0, 6:] = (changed[0, 6:] + 1) % TINY.vocab_size
    a, _ = model(idx)
    b, _ = model(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6:], b[:, 6:])


def test_bad_inputs_fail_clearly():
    model = GPT.create(TINY, seed=0)
    with pytest.raises(ValueError, match="exceeds the model's max_seq_len 32"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 50257\)"):
        model(torch.tensor([[1, 50257]]))
    with pytest.raises(ValueError, match=r"targets must lie in \[-1, 50257\)"):
        model(torch.tensor([[1, 2]]), torch.tensor([[1, 50300]]))
    with pytest.raises(ValueError, match="shape"):
        model(torch.tensor([1, 2]))


def test_config_rejects_heads_that_do_not_divide_channels():
    with pytest.raises(ValueError, match="n_embd=10 is not divisible by n_head=3"):
        GPTConfig(n_layer=1, n_head=3, n_embd=10)


def test_gradient_matches_finite_differences():
    # an independent check of the whole backward pass: central differences in float64
    config = GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=11, padded_vocab_size=16)
    model = GPT.create(config, seed=3).double()
    idx = torch.randint(0, 11, (2, 6))
    _, loss = model(idx, idx.roll(1, dims=1))
    loss.backward()
    param = model.transformer.h[0].mlp.c_fc.weight
    eps = 1e-6
    for i, j in [(0, 0), (5, 3), (31, 7)]:
        with torch.no_grad():
            param[i, j] += eps
            up = model(idx, idx.roll(1, dims=1))[1].item()
            param[i, j] -= 2 * eps
            down = model(idx, idx.roll(1, dims=1))[1].item()
            param[i, j] += eps
        assert math.isclose(param.grad[i, j].item(), (up - down) / (2 * eps), rel_tol=1e-5, abs_tol=1e-9)


def test_an_empty_model_is_built_without_torchs_compiler_and_with_torchs_init_intact():
    """`GPT.empty` (every process that loads a checkpoint) skips the modules' own init, imports neither
    torch._dynamo nor sympy (~2 CPU-seconds a process, on the meta device), leaves torch.nn.init as it was, and
    its tied lm_head is still wte's tensor."""
    code = ("import sys, torch.nn as nn; from gpt2.config import GPTConfig; from gpt2.model import GPT\n"
            "before = dict(vars(nn.init)); m = GPT.empty(GPTConfig.from_descriptor('d12'))\n"
            "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules, dict(vars(nn.init)) == before,\n"
            "      m.lm_head.weight is m.transformer.wte.weight, m.lm_head.weight.device)")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                         capture_output=True, text=True, check=True, timeout=120).stdout.split()
    assert out == ["False", "False", "True", "True", "cpu"], \
        f"torch._dynamo imported, sympy imported, torch.nn.init restored, lm_head tied, device: {out}"
