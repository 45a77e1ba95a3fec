"""gpt2_kernels.linear: a biased linear layer whose bias gradient comes out of its weight-gradient GEMM through a
column of ones beside its input, against autograd through F.linear, at odd shapes; the layout's checks;
the layout surviving torch.compile's Inductor between add_layernorm and the op; and `matmul`, quack's GEMM
at each pinned tile on a GPU (against fp32, and bit for bit against cuBLAS at d12's shapes)."""

import pytest
import torch
import torch.nn.functional as F

from gpt2_kernels import add_layernorm, biased_linear, with_ones_column
import gpt2_kernels.linear as linear
from gpt2_kernels.linear import (_biased_linear, _biased_linear_bwd, _projection, _projection_bwd, augmented,
                            padded_width)
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


@pytest.mark.parametrize("N, C, out", [(7, 5, 15), (1, 3, 9), (130, 64, 8)])
def test_projection_matches_autograd_through_f_linear_but_leaves_its_bias_gradient_to_add_layernorm(N, C, out):
    """c_proj's op: F.linear's output, the bias added in the GEMM, and F.linear's input and weight gradients;
    the bias is a constant to it (the add_layernorm after it sums the bias's gradient)."""
    h, dy, w, b = leaves(N, C, out)
    x, wl, bl = h.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
    y = linear.projection(x.view(1, N, C), wl, bl)  # a leading batch dimension, as the model passes
    y.backward(dy.view(1, N, out))
    ref = [t.clone().requires_grad_() for t in (h, w)]
    F.linear(*ref, b).backward(dy)
    assert y.shape == (1, N, out) and rel_err(y.view(N, out), F.linear(h, w, b)) < 1e-12
    for got, want in zip((x.grad, wl.grad), (t.grad for t in ref)):
        assert got.shape == want.shape and rel_err(got, want) < 1e-12
    assert bl.grad is None


def test_projection_gives_its_weight_gradient_in_fp32_from_bf16_activations():
    """Under autocast the fused model's c_proj got a bf16 weight gradient, rounded before it reached the fp32
    parameter; the op's comes out of the GEMM's fp32 accumulator."""
    h, dy, w, b = (t.float() for t in leaves(256, 32, 16, seed=3))
    wl = w.clone().requires_grad_()
    linear.projection(h.bfloat16(), wl, b).backward(dy.bfloat16())
    want = dy.bfloat16().double().t() @ h.bfloat16().double()
    assert wl.grad.dtype == torch.float32 and rel_err(wl.grad, want) < 1e-6


@pytest.mark.parametrize("op", ["biased_linear", "projection"])
def test_the_backward_uses_the_weights_the_forward_cast(op):
    """The forward's cast of the weights to the compute dtype is what the backward multiplies by (no second
    cast a micro-step): a weight changed in place after the forward neither changes the input gradient nor
    makes autograd refuse the backward, as it did while the op kept the parameter itself."""
    h, dy, w, b = (t.float() for t in leaves(33, 12, 36, seed=4))
    x, wl = with_ones_column(h, torch.bfloat16).requires_grad_(), w.clone().requires_grad_()
    y = getattr(linear, op)(x, wl, b.clone().requires_grad_())
    with torch.no_grad():
        wl.mul_(2)
    y.backward(dy.bfloat16())
    assert rel_err(x.grad, dy.bfloat16().double() @ w.bfloat16().double()) < 1e-2


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


@pytest.mark.parametrize("op", ["biased_linear", "projection"])
def test_a_weight_cast_by_the_caller_is_what_both_passes_multiply_with(op):
    """With cast_weight (the weight already in h's dtype, gpt2.step.CastWeights) the op casts nothing: the
    output and the input gradient are those of that cast, bit for bit what the op's own cast gives, and the
    weight's gradient still reaches the fp32 parameter."""
    h, dy, w, b = (t.float() for t in leaves(33, 12, 36, seed=5))
    runs = []
    for cast in (None, w.bfloat16(), 2 * w.bfloat16()):  # the last one differs from the parameter's cast
        xl, wl = with_ones_column(h, torch.bfloat16).requires_grad_(), w.clone().requires_grad_()
        y = getattr(linear, op)(xl, wl, b, cast)
        y.backward(dy.bfloat16())
        runs.append((y, xl.grad, wl.grad))
    for own, given in zip(runs[0], runs[1]):
        assert torch.equal(own, given)
    y, dx, dw = runs[2]
    assert torch.equal(dx, (dy.bfloat16() @ (2 * w.bfloat16())).to(dx.dtype))
    assert rel_err(y, h.bfloat16().double() @ (2 * w.bfloat16()).double().t() + b.bfloat16().double()) < 1e-2
    assert dw.dtype == torch.float32 and torch.equal(dw, runs[0][2])  # dyᵀ h: the weight does not enter it


@pytest.mark.parametrize("op", ["biased_linear", "projection"])
def test_a_cast_of_another_shape_or_dtype_is_refused_naming_the_one_expected(op):
    """A caller's cast in another dtype, or of another matrix (c_attn's (3C, C) handed to a (C, C) c_proj, say:
    a cast list off by one), is refused with the shape and dtype expected, in eager and in a compiled model's
    trace (the fake kernel), rather than multiplied or failing in torch's GEMM without naming the weight."""
    h, _, w, b = (t.float() for t in leaves(33, 12, 36, seed=7))
    x = with_ones_column(h, torch.bfloat16)
    for cast in (w, w[:-1].bfloat16(), w.t().bfloat16()):  # fp32; a row short; transposed
        with pytest.raises(ValueError, match=r"is not this weight's cast: expected \(36, 12\) in torch.bfloat16"):
            getattr(linear, op)(x, w, b, cast)
    compiled = torch.compile(getattr(linear, op), backend="eager", fullgraph=True)
    with pytest.raises(Exception, match=r"is not this weight's cast: expected \(36, 12\) in torch.bfloat16"):
        compiled(x, w, b, w.t().bfloat16())


@pytest.mark.parametrize("N, C, out", [(7, 5, 15), (1, 3, 9), (130, 64, 8)])
def test_projection_adds_its_weight_gradient_into_a_given_buffer(N, C, out):
    """With weight_grad (a view of the gradient buffer, gpt2.step.FlatGradients'), c_proj's weight-gradient GEMM
    adds dW into it and autograd gets none for the weight; the output and input gradient are the same bits. Two
    views of one buffer added into in one backward: eager autograd checks a saved tensor's version, which a
    buffer's views share, so each add would have refused the other view had the ops saved them."""
    h, dy, w, b = leaves(N, C, out)
    w2 = torch.randn(out, out, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def run(weight_grads):
        x, wl, w2l = h.clone().requires_grad_(), w.clone().requires_grad_(), w2.clone().requires_grad_()
        y = linear.projection(linear.projection(x, wl, b, None, weight_grads[0]), w2l, b, None, weight_grads[1])
        y.backward(dy)
        return y, x.grad, wl.grad, w2l.grad

    flat = torch.randn(out * C + out * out + 3, dtype=torch.float64)  # what earlier micro-steps added, then a tail
    before = flat.clone()
    views = flat[:out * C].view(out, C), flat[out * C:out * C + out * out].view(out, out)
    y, dx, dw, dw2 = run((None, None))
    y_into, dx_into, *none = run(views)
    assert torch.equal(y, y_into) and torch.equal(dx, dx_into) and none == [None, None]
    assert rel_err(views[0], before[:out * C].view(out, C) + dw) < 1e-12
    assert rel_err(views[1], before[out * C:-3].view(out, out) + dw2) < 1e-12
    assert torch.equal(flat[-3:], before[-3:])
    torch.library.opcheck(_projection, (h, w, b, None, views[0].clone()))
    torch.library.opcheck(_projection_bwd, (dy, h, w, torch.float64, views[0].clone()))


def test_projection_adds_its_fp32_weight_gradient_from_bf16_activations():
    """Training's case: bf16 activations, the fp32 buffer; the product added in fp32, never rounded to bf16."""
    h, dy, w, b = (t.float() for t in leaves(256, 32, 16, seed=3))
    into = torch.randn(16, 32)
    want = into.double() + dy.bfloat16().double().t() @ h.bfloat16().double()
    linear.projection(h.bfloat16(), w.clone().requires_grad_(), b, None, into).backward(dy.bfloat16())
    assert rel_err(into, want) < 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("M, K, N", [(40, 1000, 24), (1600, 16384, 1600), (1600, 16384, 6400), (768, 8192, 3072)])
def test_accumulate_matmul_is_the_product_added_after_bit_for_bit(M, K, N):
    """On CUDA the GEMM adds the bf16 product's fp32 accumulator into the buffer (cuBLAS's beta = 1): the same bits
    as writing the product in fp32 (`matmul_out`, what the op returned before) and adding it to the buffer after,
    into a view of a larger buffer, the rest untouched (c_proj's weight-gradient shapes at d48 and d12, and odd)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(K, M, device="cuda", generator=g).bfloat16().t()  # dyᵀ: a transposed view, as the op passes
    b = torch.randn(K, N, device="cuda", generator=g).bfloat16()
    flat = torch.randn(M * N + 8, device="cuda", generator=g)
    want = flat.clone()
    want[4:4 + M * N].view(M, N).add_(linear.matmul_out(a, b, torch.float32))
    linear.accumulate_matmul(a, b, flat[4:4 + M * N].view(M, N))
    assert torch.equal(flat, want)


def test_ops_pass_opcheck():
    h, dy, w, b = (t.float() for t in leaves(9, 4, 12))
    h = with_ones_column(h)
    w_proj = w[:, :4].contiguous()
    for cast, cast_proj in ((None, None), (w.clone(), w_proj.clone())):  # cast in the op, or by the caller
        torch.library.opcheck(_biased_linear, (h, w, b, cast), test_utils=OPCHECKS)
        torch.library.opcheck(_projection, (h, w_proj, b, cast_proj, None))
    torch.library.opcheck(_biased_linear_bwd, (dy, h, w, torch.float32), test_utils=OPCHECKS)
    torch.library.opcheck(_projection_bwd, (dy, h.contiguous(), w[:, :4].contiguous(), torch.float32, None))


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


def test_only_operands_a_tma_load_can_read_go_to_quack():
    """matmul sends quack only 2-D operands with a unit stride, the other stride a multiple of 16 bytes and a
    16-byte aligned start (the ones-column layout is one); anything else stays with torch's matmul."""
    x = torch.zeros(64, 80, dtype=torch.bfloat16)
    assert linear._tma_loadable(x) and linear._tma_loadable(x.t()) and linear._tma_loadable(x[:, :72])
    assert linear._tma_loadable(with_ones_column(torch.zeros(5, 768, dtype=torch.bfloat16)))
    assert not linear._tma_loadable(x[:, 1:])  # starts 2 bytes past an aligned address
    assert not linear._tma_loadable(torch.zeros(64, 81, dtype=torch.bfloat16)[:, :80])  # rows 162 bytes apart
    assert not linear._tma_loadable(x[:, ::2])  # no unit stride
    assert not linear._tma_loadable(x[0])  # 1-D


def test_only_16_bit_operands_of_one_dtype_go_to_quack():
    """quack's SM90 GEMM takes bf16 or fp16 inputs: fp32 operands (the fp32 reference paths, bench.numerics)
    and mixed dtypes stay with torch's matmul."""
    a, b, bias = torch.zeros(64, 80, dtype=torch.bfloat16), torch.zeros(80, 48, dtype=torch.bfloat16), None
    assert linear._suits_quack(a, b, bias) and linear._suits_quack(a.half(), b.half(), torch.zeros(48).half())
    assert not linear._suits_quack(a.float(), b.float(), bias)
    assert not linear._suits_quack(a, b.half(), bias)
    assert not linear._suits_quack(a, b, torch.zeros(48))
    assert not linear._suits_quack(a[:, 1:], b[1:], bias)  # not TMA-loadable


SITES = ("C_ATTN_FORWARD", "C_ATTN_INPUT_GRAD", "MLP_PROJ_FORWARD", "MLP_FC_INPUT_GRAD", "ATTN_PROJ", "MLP_FC_FORWARD")


def test_each_call_site_has_a_tile_at_every_width():
    """Every call site pins d12's tile, which any width without one of its own takes; d24's and d48's widths
    have their own at every site but c_attn's and c_fc's forwards at 1024, where d12's was the fastest."""
    for site in SITES:
        table = getattr(linear, site)
        assert linear.tile_for(table, 768) is table[768] and linear.tile_for(table, 1280) is table[768]
        assert set(table) - {768, 1024, 1600} == set()
        for tile in table.values():
            assert set(tile) == {"tile_m", "tile_n", "pingpong", "cluster_m", "cluster_n"}
            assert tile["cluster_m"] * tile["cluster_n"] == 2
    assert linear.tile_for(linear.C_ATTN_FORWARD, 1024) is linear.C_ATTN_FORWARD[768]
    assert linear.tile_for(linear.MLP_PROJ_FORWARD, 1600)["tile_n"] == 160  # 1600 = 10 x 160, no ragged tile
    assert linear.tile_for(linear.MLP_FC_FORWARD, 1600)["tile_n"] == 160  # 6400 = 40 x 160


@pytest.mark.gpu
@pytest.mark.parametrize("site, width", [(site, width) for site in SITES for width in (768, 1024, 1600)])
def test_quack_matmul_on_gpu(site, width):
    """Each pinned tile against the fp32 product at odd shapes (rows and columns not a multiple of a tile, an
    operand transposed, h in the ones-column layout, with and without a bias), and bit for bit against
    cuBLAS at d12's shapes, as measured (bench/reports/2026-11-27-h100-block-gemms-on-quack.md)."""
    name = linear.configure_linear(torch.bfloat16, "cuda")
    tile = linear.tile_for(getattr(linear, site), width)
    try:
        if name != "quack-gemm":
            pytest.skip(f"quack-kernels not installed or not applicable here ({name})")
        g = torch.Generator(device="cuda").manual_seed(4)
        for M, K, N, bias in [(1000, 768, 2304, True), (129, 72, 200, False), (300, 3072, 776, True)]:
            a = with_ones_column(torch.randn(M, K, device="cuda", generator=g).bfloat16())
            w = torch.randn(N, K, device="cuda", generator=g).bfloat16()
            b = torch.randn(N, device="cuda", generator=g).bfloat16() if bias else None
            y = linear.matmul(a, w.t(), b, tile)
            ref = a.float() @ w.float().t() + (b.float() if bias else 0)
            assert y.dtype == torch.bfloat16 and rel_err(y, ref) < 1e-2
            assert torch.equal(linear.matmul(a.float(), w.float().t(), None, tile),
                               a.float() @ w.float().t())  # fp32: torch's
        a, w = (torch.randn(65536, 768, device="cuda", generator=g).bfloat16(),
                torch.randn(2304, 768, device="cuda", generator=g).bfloat16() * 0.02)
        b = torch.randn(2304, device="cuda", generator=g).bfloat16()
        if width == 768:
            assert torch.equal(linear.matmul(a, w.t(), b, tile), torch.addmm(b, a, w.t()))
    finally:
        linear._quack_gemm_on_cuda = False
