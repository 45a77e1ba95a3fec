"""The fused path's attention op (gpt2_kernels/attention.py) against PyTorch's SDPA, at odd shapes.

On CPU the op runs its reference (FlashAttention's backward formulas written out); it is checked
against autograd through `F.scaled_dot_product_attention`, an independent implementation. On a GPU with
flash-attn-4 installed, the cuDNN forward + FA4 backward op is checked against the fp32 reference.
"""

import pytest
import torch
import torch.nn.functional as F

import gpt2_kernels.attention as attention
from tests.fixtures.numerics import rel_err

SHAPES = [(2, 13, 3, 5), (1, 1, 1, 8), (3, 37, 2, 16)]  # (B, T, n_head, head_size): odd T, tiny heads


def sdpa_reference(qkv: torch.Tensor, n_head: int) -> torch.Tensor:
    """Causal attention on the packed projection through PyTorch's SDPA (math on CPU)."""
    B, T, C3 = qkv.shape
    q, k, v = (t.view(B, T, n_head, -1).transpose(1, 2) for t in qkv.split(C3 // 3, dim=2))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C3 // 3)


def packed_inputs(B, T, n_head, hs, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    qkv = torch.randn(B, T, 3 * n_head * hs, dtype=dtype, device=device, generator=g)
    dy = torch.randn(B, T, n_head * hs, dtype=dtype, device=device, generator=g)
    return qkv, dy


@pytest.mark.parametrize("shape", SHAPES)
def test_reference_forward_and_lse(shape):
    B, T, n_head, hs = shape
    qkv, _ = packed_inputs(*shape)
    y, lse = attention.attention_reference_fwd(qkv, n_head)
    assert rel_err(y, sdpa_reference(qkv, n_head)) < 1e-12
    # lse by its definition, one query at a time: log Σ_{j<=i} exp(q_i·k_j / √hs)
    q, k, _ = (t.view(B, T, n_head, hs) for t in qkv.split(n_head * hs, dim=2))
    for i in (0, T - 1):
        scores = torch.einsum("bhd,bjhd->bhj", q[:, i], k[:, : i + 1]) / hs**0.5
        assert torch.allclose(lse[:, :, i], torch.logsumexp(scores, dim=-1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_reference_backward_matches_autograd(shape):
    n_head = shape[2]
    qkv, dy = packed_inputs(*shape)
    y, lse = attention.attention_reference_fwd(qkv, n_head)
    dqkv = attention.attention_reference_bwd(dy, qkv, y, lse, n_head)
    x = qkv.clone().requires_grad_()
    sdpa_reference(x, n_head).backward(dy)
    assert rel_err(dqkv, x.grad) < 1e-12


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_op_autograd_on_cpu_matches_sdpa(dtype):
    """causal_attention's custom op with its registered backward, as the fused model calls it."""
    qkv, dy = packed_inputs(2, 19, 3, 8, dtype=torch.float32)
    x = qkv.to(dtype, copy=True).requires_grad_()
    y = attention.causal_attention(x, 3)
    y.backward(dy.to(dtype))
    ref = qkv.to(dtype).double().requires_grad_()  # the same rounded inputs, in float64
    y_ref = sdpa_reference(ref, 3)
    y_ref.backward(dy.double())
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert y.dtype == x.grad.dtype == dtype
    assert rel_err(y, y_ref) < tol
    assert rel_err(x.grad, ref.grad) < tol


def test_ops_pass_opcheck():
    """Fake (meta) implementations agree with the real ones: what torch.compile traces is what runs."""
    qkv, dy = packed_inputs(2, 9, 2, 4, dtype=torch.float32)
    torch.library.opcheck(attention._attention_fwd, (qkv.requires_grad_(), 2))
    y, lse = attention._attention_fwd(qkv.detach(), 2)
    torch.library.opcheck(attention._attention_bwd, (dy, qkv.detach(), y, lse, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1024, 300])
def test_fa4_backward_on_gpu(T):
    """cuDNN forward + FlashAttention-4 backward (where installed) against the fp32 reference."""
    name = attention.configure_attention(n_head=12, head_size=64)
    try:
        if not name.endswith("+fa4-bwd"):
            pytest.skip(f"flash-attn-4 not installed or not applicable here (attention: {name})")
        qkv, dy = packed_inputs(2, T, 12, 64, dtype=torch.bfloat16, device="cuda")
        x = qkv.clone().requires_grad_()
        y = attention.causal_attention(x, 12)
        y.backward(dy)
        y_ref, lse_ref = attention.attention_reference_fwd(qkv.float(), 12)
        dqkv_ref = attention.attention_reference_bwd(dy.float(), qkv.float(), y_ref, lse_ref, 12)
        assert rel_err(y, y_ref) < 1e-2
        assert rel_err(x.grad, dqkv_ref) < 1e-2
        x2 = qkv.clone().requires_grad_()
        attention.causal_attention(x2, 12).backward(dy)
        assert torch.equal(x.grad, x2.grad)  # deterministic backward: resumed runs repeat exactly
    finally:
        attention._fa4_backward_on_cuda = False
        attention.enable_all_sdpa_backends()
