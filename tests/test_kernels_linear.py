"""kernels.linear: a biased linear layer whose bias gradient comes out of its weight-gradient GEMM through a
column of ones beside its input, against autograd through F.linear, at odd shapes; the layout's checks;
and the layout surviving torch.compile's Inductor between add_layernorm and the op."""

import pytest
import torch
import torch.nn.functional as F

from kernels import add_layernorm, biased_linear, with_ones_column
from kernels.linear import _biased_linear, _biased_linear_bwd, augmented, padded_width
from tests.fixtures.numerics import rel_err

OPCHECKS = ("test_schema", "test_faketensor", "test_autograd_registration")  # the AOT ones clone h: no column


def leaves(N, C, out, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    h, dy = torch.randn(N, C, dtype=dtype, generator=g), torch.randn(N, out, dtype=dtype, generator=g)
    w, b = torch.randn(out, C, dtype=dtype, generator=g), torch.randn(out, dtype=dtype, generator=g)
    return h, dy, w, b


@pytest.mark.parametrize("N, C, out", [(7, 5, 15), (1, 3, 9), (33, 12, 36), (130, 64, 8)])
def test_gradients_match_autograd_through_f_linear(N, C, out):
    h, dy, w, b = leaves(N, C, out)
    x, wl, bl = with_ones_column(h).requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
    y = biased_linear(x, wl, bl)
    y.backward(dy)
    ref = [t.clone().requires_grad_() for t in (h, w, b)]
    y_ref = F.linear(*ref)
    y_ref.backward(dy)
    assert rel_err(y, y_ref) < 1e-12
    for got, want in zip((x.grad, wl.grad, bl.grad), (t.grad for t in ref)):
        assert got.shape == want.shape and rel_err(got, want) < 1e-12


def test_weight_and_bias_gradients_come_in_the_weights_dtype():
    """bf16 activations, fp32 parameters (training under autocast): the op computes in h's dtype and its
    weight and bias gradients come out in fp32, the bias's no longer a bf16 column sum rounded first."""
    h, dy, w, b = leaves(64, 16, 24, dtype=torch.float32, seed=1)
    wl, bl = w.clone().requires_grad_(), b.clone().requires_grad_()
    y = biased_linear(with_ones_column(h, torch.bfloat16), wl, bl)
    assert y.dtype == torch.bfloat16
    y.backward(dy.bfloat16())
    assert wl.grad.dtype == bl.grad.dtype == torch.float32
    assert rel_err(bl.grad, dy.bfloat16().double().sum(0)) < 1e-6


def test_ops_pass_opcheck():
    h, dy, w, b = (t.float() for t in leaves(9, 4, 12))
    h = with_ones_column(h)
    torch.library.opcheck(_biased_linear, (h, w, b), test_utils=OPCHECKS)
    torch.library.opcheck(_biased_linear_bwd, (dy, h, w), test_utils=OPCHECKS)


def test_an_input_without_the_column_is_refused_in_forward():
    """A dense input (no room for the column), and rows whose storage ends before the last row's column:
    refused before any matmul, naming the way to lay the input out, rather than read past it."""
    _, _, w, b = leaves(4, 4, 12)
    for h in (torch.randn(9, 4, dtype=torch.float64),
              torch.randn(30, dtype=torch.float64).as_strided((3, 4), (12, 1))):
        with pytest.raises(ValueError, match=r"does not carry a ones column: pass the output of add_layernorm"):
            biased_linear(h, w, b)


def test_the_column_survives_inductor_between_add_layernorm_and_the_op():
    """torch.compile (Inductor, CPU) of LayerNorm -> biased_linear keeps the padded rows the op reads its
    bias gradient from: same gradients as autograd through the plain ops."""
    N, C, out = 24, 16, 48
    h, dy, w, b = (t.float() for t in leaves(N, C, out, seed=2))
    ln_w, ln_b = torch.ones(C) * 1.5, torch.zeros(C) + 0.1

    def fused(x, w, b):
        _, normed = add_layernorm(x, None, ln_w, ln_b, ones_column=True)
        return biased_linear(normed, w, b)  # raises if the compiled graph handed it dense rows

    params = [t.clone().requires_grad_() for t in (h, w, b)]
    torch.compile(fused, backend="inductor", fullgraph=True)(*params).backward(dy)
    ref = [t.double().requires_grad_() for t in (h, w, b)]
    F.linear(F.layer_norm(ref[0], (C,), ln_w.double(), ln_b.double()), ref[1], ref[2]).backward(dy.double())
    for got, want in zip(params, ref):
        assert rel_err(got.grad, want.grad) < 1e-5


def test_augmented_view_reads_the_one_and_zeros():
    h = with_ones_column(torch.randn(5, 10))
    tail = augmented(h)[:, 10:]
    assert torch.equal(tail[:, 0], torch.ones(5)) and torch.equal(tail[:, 1:], torch.zeros(5, 7))
    assert h.stride() == (64, 1) and padded_width(768) == 832
