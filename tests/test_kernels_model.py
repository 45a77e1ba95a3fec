"""GPT(use_kernels=True) against the plain path of the same weights, and the SDPA backend check.

A tiny fp32 config: the two paths compute the same function, so loss, logits and every parameter
gradient agree to fp32 rounding (relative 1e-5); the compiled kernel path (aot_eager, one graph) too.
"""

import pytest
import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT
from kernels.attention import configure_sdpa
from tests.fixtures.numerics import rel_err

CONFIG = GPTConfig(n_layer=2, n_head=2, n_embd=24, block_size=16, vocab_size=101, padded_vocab_size=128)


def models_and_batch():
    plain = GPT.create(CONFIG, seed=1)
    fused = GPT.create(CONFIG, seed=1, use_kernels=True)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, CONFIG.vocab_size, (2, 16), generator=g)
    targets = torch.randint(0, CONFIG.vocab_size, (2, 16), generator=g)
    targets[0, :3] = -1  # ignored positions
    return plain, fused, idx, targets


def assert_same_grads(plain: GPT, fused: GPT) -> None:
    for (name, p), q in zip(plain.named_parameters(), fused.parameters()):
        assert rel_err(q.grad, p.grad) < 1e-5, name


def test_kernel_path_matches_plain_path():
    plain, fused, idx, targets = models_and_batch()
    _, loss_plain = plain(idx, targets, return_logits=False)
    _, loss_fused = fused(idx, targets, return_logits=False)
    loss_plain.backward()
    loss_fused.backward()
    assert abs(loss_fused.item() - loss_plain.item()) < 1e-5 * loss_plain.item()
    assert_same_grads(plain, fused)
    with torch.no_grad():  # logits (evaluation, sampling) go through the fused blocks too
        assert rel_err(fused(idx)[0], plain(idx)[0]) < 1e-5


def test_reference_fallback_matches_plain_path(monkeypatch):
    """Machines without Triton run the ops' PyTorch references: the same results, through the same
    custom-op contract (for one, outputs may not alias each other, which fp32 makes easy to break)."""
    import kernels.cross_entropy
    import kernels.layernorm

    for module in (kernels.cross_entropy, kernels.layernorm):
        monkeypatch.setattr(module, "use_triton", lambda t: False)
    plain, fused, idx, targets = models_and_batch()
    plain(idx, targets, return_logits=False)[1].backward()
    fused(idx, targets, return_logits=False)[1].backward()
    assert_same_grads(plain, fused)


def test_inductor_fallbacks_registered(monkeypatch):
    """GPT(use_kernels=True) registers the ops' Inductor lowerings up front (see kernels/compile.py)."""
    from torch._inductor.lowering import lowerings

    ops = [getattr(torch.ops.gpt2_kernels, name).default
           for name in ("linear_cross_entropy", "add_layernorm_fwd", "add_layernorm_bwd")]
    for op in ops:  # earlier tests may have registered them already: start from none
        if op in lowerings:
            monkeypatch.delitem(lowerings, op)
    GPT(CONFIG, use_kernels=True)
    for op in ops:
        assert op in lowerings, op


def test_compiled_kernel_path_is_one_graph():
    """fullgraph=True fails on any graph break: the custom ops must trace as single nodes."""
    plain, fused, idx, targets = models_and_batch()
    plain(idx, targets, return_logits=False)[1].backward()
    compiled = torch.compile(fused, backend="aot_eager", fullgraph=True)
    compiled(idx, targets, return_logits=False)[1].backward()
    assert_same_grads(plain, fused)


@pytest.mark.slow
def test_inductor_compiled_kernel_path_matches_plain_path():
    """Inductor (not just tracing): the ops lower through the registered fallbacks and still give
    the plain path's gradients."""
    from torch._inductor import config as inductor_config

    plain, fused, idx, targets = models_and_batch()
    plain(idx, targets, return_logits=False)[1].backward()
    # Inductor's on-disk graph cache does not key on a custom op's schema: after an op gains an output,
    # a cached graph would index the old outputs
    with inductor_config.patch(force_disable_caches=True):
        torch.compile(fused)(idx, targets, return_logits=False)[1].backward()
    assert_same_grads(plain, fused)


@pytest.mark.gpu
def test_configure_sdpa_picks_an_accurate_fused_backend():
    cuda = torch.backends.cuda
    saved = (cuda.cudnn_sdp_enabled(), cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
             cuda.math_sdp_enabled())
    try:
        name = configure_sdpa(n_head=12, head_size=64)
        assert name in ("cudnn", "flash", "efficient")
        assert cuda.math_sdp_enabled() is False  # no silent fallback left on
    finally:
        for enable, on in zip((cuda.enable_cudnn_sdp, cuda.enable_flash_sdp, cuda.enable_mem_efficient_sdp,
                               cuda.enable_math_sdp), saved):
            enable(on)
