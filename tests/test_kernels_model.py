"""GPT(use_kernels=True) against the plain path of the same weights, and the SDPA backend check.

A tiny fp32 config: the two paths compute the same function, so loss, logits and every parameter
gradient agree to fp32 rounding (relative 1e-5); the compiled kernel path (aot_eager, one graph) too.
Under bf16 autocast they round differently (the kernel path keeps its residual stream in bf16, as
llm.c does): there both are compared with the fp32 plain path, within the kernel tests' bf16
tolerance (2e-2), which the plain path under bf16 must meet as well.
"""

import pytest
import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2_kernels import add_layernorm, with_ones_column
from gpt2_kernels.attention import configure_sdpa
from tests.fixtures.numerics import rel_err, without_triton

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


def test_kernel_path_keeping_post_matches_plain_path(monkeypatch):
    """With a memory budget for it (gpt2_kernels.mlp.configure_mlp's keep_post_bytes), every MLP of the tiny model
    holds its (B·T, 4C) GELU output for backward, one more such tensor a layer, and the result is unchanged.
    LayerNorm and the loss run their PyTorch references: the MLP's budget is under test, not Triton's kernels."""
    import gpt2_kernels.mlp

    without_triton(monkeypatch)

    def saved_hidden_tensors(model: GPT, idx, targets) -> int:
        shapes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(t.shape) or t, lambda t: t):
            _, loss = model(idx, targets, return_logits=False)
        loss.backward()
        return sum(s == (idx.numel(), 4 * CONFIG.n_embd) for s in shapes)

    plain, fused, idx, targets = models_and_batch()
    rebuilding = saved_hidden_tensors(fused, idx, targets)
    monkeypatch.setattr(gpt2_kernels.mlp, "_kept_post_bytes", 1e9)
    plain, fused, idx, targets = models_and_batch()
    assert saved_hidden_tensors(fused, idx, targets) == rebuilding + CONFIG.n_layer
    _, loss_plain = plain(idx, targets, return_logits=False)
    loss_plain.backward()
    assert_same_grads(plain, fused)


def test_fused_branch_is_forward_and_hands_on_its_bias():
    """The fused path's branch is the branch's forward, c_proj's bias included (added in its GEMM), and hands
    the bias on for add_layernorm to sum its gradient, through the attention op or SDPA, and, for the MLP, its
    plain ops or the GELU-epilogue op (the ops' references on CPU), from an input laid out with its column of
    ones as add_layernorm writes it."""
    model = GPT.create(CONFIG, seed=1)
    with torch.no_grad():  # GPT-2's init zeroes the biases: give c_proj's values to add
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(4)))
    h = with_ones_column(torch.randn(2, 16, CONFIG.n_embd, generator=torch.Generator().manual_seed(3)))
    attn, mlp = model.transformer.h[0].attn, model.transformer.h[0].mlp
    for packed_attention in (False, True):
        y, proj_bias = attn.fused_branch(h, packed_attention)
        assert proj_bias is attn.c_proj.bias and rel_err(y, attn(h)) < 1e-6
    for gelu_epilogue_dtype in (None, torch.float32):
        y, proj_bias = mlp.fused_branch(h, gelu_epilogue_dtype)
        assert proj_bias is mlp.c_proj.bias and rel_err(y, mlp(h)) < 1e-6


def run_bf16(model: GPT, idx: torch.Tensor, targets: torch.Tensor, enabled: bool = True) -> float:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
        _, loss = model(idx, targets, return_logits=False)
    loss.backward()
    return loss.item()


def test_bf16_kernel_path_keeps_a_bf16_residual_stream_and_sums_the_proj_bias_gradients(monkeypatch):
    """Every fused add+LayerNorm gets the residual stream in bf16 and the branch's c_proj bias, to sum its
    gradient (what the op is handed, so its PyTorch reference runs: the kernels' own tests cover the kernel)."""
    import gpt2.model

    without_triton(monkeypatch)

    calls = []

    def recording_add_layernorm(x, y, *args, bias_in_y=None, **kwargs):
        calls.append((x.dtype, y is not None, bias_in_y))
        return add_layernorm(x, y, *args, bias_in_y=bias_in_y, **kwargs)

    monkeypatch.setattr(gpt2.model, "add_layernorm", recording_add_layernorm)
    _, fused, idx, targets = models_and_batch()
    run_bf16(fused, idx, targets)
    assert [dtype for dtype, _, _ in calls] == [torch.bfloat16] * (2 * CONFIG.n_layer + 1)
    proj_biases = [b.c_proj.bias for block in fused.transformer.h for b in (block.attn, block.mlp)]
    assert [bias for _, has_y, bias in calls if has_y] == proj_biases
    assert [bias for _, has_y, bias in calls if not has_y] == [None]


def test_bf16_kernel_path_reads_the_matrices_cast_by_the_caller(monkeypatch):
    """forward's cast_weights, every block's four matrices already in bf16 (gpt2.step.CastWeights, once per
    optimizer step): the loss and every gradient bit for bit those of the forward casting them itself, eager and
    compiled as one graph; and these are what it multiplies with (a cast unlike its parameter moves the loss).
    LayerNorm and the loss run their PyTorch references: the casts, not Triton's interpreter (five passes of it
    were 20 of this test's 21 CPU-seconds), are under test."""
    without_triton(monkeypatch)
    plain, fused, idx, targets = models_and_batch()
    assert plain.matrices() == []  # the plain path casts under autocast
    casts = [p.detach().bfloat16() for p in fused.matrices()]
    assert len(casts) == 4 * CONFIG.n_layer

    def loss_and_grads(model, **kwargs):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = model(idx, targets, return_logits=False, **kwargs)
        loss.backward()
        grads = [p.grad for p in fused.parameters()]
        fused.zero_grad(set_to_none=True)
        return [loss.detach(), *grads]

    compiled = torch.compile(fused, backend="aot_eager", fullgraph=True)
    own = {model: loss_and_grads(model) for model in (fused, compiled)}
    for model in (fused, compiled):
        for expected, given in zip(own[model], loss_and_grads(model, cast_weights=casts)):
            assert torch.equal(expected, given)
    casts[2].mul_(2)  # block 0's c_fc
    assert loss_and_grads(fused, cast_weights=casts)[0] != own[fused][0]


def test_bf16_kernel_path_is_as_close_to_fp32_as_the_bf16_plain_path():
    plain, fused, idx, targets = models_and_batch()
    loss_fp32 = run_bf16(plain, idx, targets, enabled=False)
    grads_fp32 = {name: p.grad for name, p in plain.named_parameters()}
    plain.zero_grad(set_to_none=True)
    loss_plain = run_bf16(plain, idx, targets)
    loss_fused = run_bf16(fused, idx, targets)
    # the numerics criterion of docs/kernels.md: no further from exact arithmetic than plain bf16 x 2
    assert abs(loss_fused - loss_fp32) <= 2 * abs(loss_plain - loss_fp32)
    for (name, p), q in zip(plain.named_parameters(), fused.parameters()):
        assert rel_err(p.grad, grads_fp32[name]) < 2e-2, f"plain {name}"
        assert rel_err(q.grad, grads_fp32[name]) < 2e-2, f"kernels {name}"


@pytest.mark.slow  # 34 s, with d12's vocabulary 55 (one thread each, Triton's interpreter, a busy 32-core host)
def test_bf16_kernel_path_moves_with_a_tiny_proj_bias_as_fp32_does():
    """The first AdamW step sets the zero-initialised c_proj biases to about lr = 1e-6 (llm.c's warmup); the
    bf16 paths should move the loss by about what fp32 does. While add_layernorm added the bias, in the bf16
    residual's one rounding, the kernel path moved it over 20 times as far (2026-11-28, on the CPU and in the
    Triton kernel; bench.numerics' first-step gap at d12-d48): a bias far below the residual's ulp settled
    every exact tie of x + y its way. c_proj's GEMM adds it now, before its output's rounding. With 8,192 tokens
    the code before failed at three batch seeds (the loss moved 17 to 38 times as far as fp32's), and passes now."""
    config = GPTConfig(n_layer=2, n_head=4, n_embd=256, block_size=128, vocab_size=8192)
    idx = torch.randint(0, config.vocab_size, (2, 129), generator=torch.Generator().manual_seed(0))
    reference = GPT.create(config, seed=42)
    reference(idx[:, :-1], idx[:, 1:], return_logits=False)[1].backward()
    step = {name: -1e-6 * p.grad.sign() for name, p in reference.named_parameters() if name.endswith("c_proj.bias")}

    def loss_change(use_kernels: bool, bf16: bool) -> float:
        model = GPT.create(config, seed=42, use_kernels=use_kernels)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            before = model(idx[:, :-1], idx[:, 1:], return_logits=False)[1].item()
            for name, p in model.named_parameters():
                p.add_(step.get(name, 0.0))
            return model(idx[:, :-1], idx[:, 1:], return_logits=False)[1].item() - before

    fp32, plain, fused = loss_change(False, False), loss_change(False, True), loss_change(True, True)
    assert abs(fused - fp32) <= 2 * abs(plain - fp32) + 1e-4, (fp32, plain, fused)


def test_reference_fallback_matches_plain_path(monkeypatch):
    """Machines without Triton run the ops' PyTorch references: the same results, through the same
    custom-op contract (for one, outputs may not alias each other, which fp32 makes easy to break)."""
    without_triton(monkeypatch)
    plain, fused, idx, targets = models_and_batch()
    plain(idx, targets, return_logits=False)[1].backward()
    fused(idx, targets, return_logits=False)[1].backward()
    assert_same_grads(plain, fused)


def test_inductor_fallbacks_registered(monkeypatch):
    """GPT(use_kernels=True) registers the ops' Inductor lowerings up front (see gpt2_kernels/compile.py)."""
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
