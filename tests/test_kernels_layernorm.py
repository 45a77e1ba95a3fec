"""gpt2_kernels.layernorm: fused residual add + LayerNorm vs autograd through the plain formula in float64.

Tolerances (relative L2 error): fp32 everywhere 1e-5; bf16 in the op (a bf16 branch input, a bf16
residual stream, a bf16 normalised output) 2e-2: outputs and gradients are rounded to bf16, whose unit
roundoff is 2^-8, and the reference sees the same bf16-rounded inputs and incoming gradients, so only
the kernel's own rounding is measured. A bf16 residual is the exact sum rounded once: at most 2^-7
relative, because Triton's interpreter (not the GPU, which rounds to nearest) truncates fp32 to bf16.
"""

import pytest
import torch

from gpt2_kernels.layernorm import _BWD_CONFIGS, add_layernorm, add_layernorm_backward, add_layernorm_reference
from gpt2_kernels.linear import ONES_COLUMNS, augmented, padded_width
from tests.fixtures.numerics import rel_err

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
F32, BF16 = torch.float32, torch.bfloat16


@pytest.mark.parametrize(
    "N, C, x_dtype, y_dtype, with_bias_in_y, out_dtype, tol",
    [
        # rows and C not powers of two; 37 rows > 16 backward programs on CPU, so programs walk
        # several rows and the last one runs past the end (masked)
        (37, 24, F32, F32, False, F32, 1e-5),
        (37, 24, F32, F32, True, F32, 1e-5),  # with the gradient of the c_proj bias in y
        (13, 100, F32, BF16, False, BF16, 2e-2),  # an fp32 residual stream, bf16 branch
        (13, 100, F32, BF16, True, BF16, 2e-2),
        (13, 100, BF16, BF16, False, BF16, 2e-2),  # the bf16 residual stream (llm.c's layout)
        (37, 100, BF16, BF16, True, BF16, 2e-2),  # the training layout: bf16 stream, fp32 c_proj bias
        (5, 24, F32, None, False, F32, 1e-5),  # plain LayerNorm (first block's ln_1)
        (5, 100, BF16, None, False, BF16, 2e-2),  # first block's ln_1 of a bf16 stream
    ],
)
def test_matches_reference(N, C, x_dtype, y_dtype, with_bias_in_y, out_dtype, tol):
    g = torch.Generator().manual_seed(N * C)
    x = torch.randn(N, C, generator=g).to(DEVICE, x_dtype).requires_grad_()
    y = torch.randn(N, C, generator=g).to(DEVICE, y_dtype).requires_grad_() if y_dtype else None
    w = (1 + 0.5 * torch.randn(C, generator=g)).to(DEVICE).requires_grad_()
    b = (0.1 * torch.randn(C, generator=g)).to(DEVICE).requires_grad_()
    bias_in_y = (0.3 * torch.randn(C, generator=g)).to(DEVICE).requires_grad_() if with_bias_in_y else None
    # incoming gradients, rounded to the dtypes autograd will hand the op
    d_res = torch.randn(N, C, generator=g).to(DEVICE, x_dtype)
    d_out = torch.randn(N, C, generator=g).to(DEVICE, out_dtype)

    residual, out = add_layernorm(x, y, w, b, out_dtype=out_dtype, bias_in_y=bias_in_y)
    assert residual.dtype == x_dtype and out.dtype == out_dtype
    torch.autograd.backward((residual, out), (d_res, d_out))

    inputs = {"x": x, "weight": w, "bias": b, "y": y, "bias_in_y": bias_in_y}
    inputs = {name: t for name, t in inputs.items() if t is not None}
    ref = {name: t.detach().double().requires_grad_() for name, t in inputs.items()}
    ref_res, ref_out = add_layernorm_reference(ref["x"], ref.get("y"), ref["weight"], ref["bias"],
                                               bias_in_y=ref.get("bias_in_y"))
    torch.autograd.backward((ref_res, ref_out), (d_res.double(), d_out.double()))

    assert rel_err(residual, ref_res) < (1e-6 if x_dtype == F32 else 2**-7)
    assert rel_err(out, ref_out) < tol
    for name, t in inputs.items():
        assert t.grad.dtype == t.dtype, name
        assert rel_err(t.grad, ref[name].grad) < tol, name


def test_unused_residual_output():
    """ln_f's residual output feeds nothing: its gradient arrives as None or zeros, both must work."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 24, generator=g).to(DEVICE).requires_grad_()
    y = torch.randn(6, 24, generator=g).to(DEVICE).requires_grad_()
    w, b = torch.ones(24, device=DEVICE), torch.zeros(24, device=DEVICE)
    d_out = torch.randn(6, 24, generator=g).to(DEVICE)
    _, out = add_layernorm(x, y, w, b)
    out.backward(d_out)
    rx, ry = x.detach().double().requires_grad_(), y.detach().double().requires_grad_()
    add_layernorm_reference(rx, ry, w.double(), b.double())[1].backward(d_out.double())
    assert rel_err(x.grad, rx.grad) < 1e-5 and rel_err(y.grad, ry.grad) < 1e-5


@pytest.mark.parametrize("dtype, tol", [(F32, 1e-5), (BF16, 2e-2)])
def test_the_bias_in_y_is_not_added_again_and_gets_the_column_sum_of_dy(dtype, tol):
    """The c_proj bias is already in y (its GEMM added it before y's one rounding): the op leaves every value
    as it is without the bias, bit for bit, and returns the bias's gradient, Σ_rows d(residual). Added again
    here, a bias far below the bf16 residual's ulp would settle every exact tie of x + y its way."""
    g = torch.Generator().manual_seed(5)
    x, y, d_res, d_out = (torch.randn(37, 100, generator=g).to(DEVICE, dtype) for _ in range(4))
    w, b = (1 + 0.5 * torch.randn(100, generator=g)).to(DEVICE), (0.1 * torch.randn(100, generator=g)).to(DEVICE)
    bias_in_y = torch.full((100,), 1e-6, device=DEVICE, requires_grad=True)
    with_bias = add_layernorm(x, y, w, b, out_dtype=dtype, bias_in_y=bias_in_y)
    without = add_layernorm(x, y, w, b, out_dtype=dtype)
    assert torch.equal(with_bias[0], without[0]) and torch.equal(with_bias[1], without[1])
    leaves = [t.clone().requires_grad_() for t in (x, y)]
    torch.autograd.backward(add_layernorm(*leaves, w, b, out_dtype=dtype, bias_in_y=bias_in_y), (d_res, d_out))
    assert rel_err(bias_in_y.grad, leaves[1].grad.double().sum(0)) < tol  # dy: d(residual) rounded to y's dtype


@pytest.mark.parametrize("x_dtype, out_dtype", [(F32, F32), (BF16, BF16)])
@pytest.mark.parametrize("with_bias_in_y", [False, True], ids=["", "bias_in_y"])
@pytest.mark.parametrize("ones_column", [False, True], ids=["", "ones_column"])
def test_opcheck_fake_and_autograd_registrations(x_dtype, out_dtype, with_bias_in_y, ones_column):
    """Also checks that no two outputs alias, in the layouts where the residual itself is saved."""
    g = torch.Generator().manual_seed(2)
    x, y = (torch.randn(4, 24, generator=g).to(DEVICE, x_dtype).requires_grad_() for _ in range(2))
    w, b, bias_in_y = (torch.randn(24, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    op = torch.ops.gpt2_kernels.add_layernorm_fwd.default
    torch.library.opcheck(op, (x, y, bias_in_y if with_bias_in_y else None, w, b, 1e-5, out_dtype, ones_column),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


@pytest.mark.parametrize("N, C, dtype", [(37, 24, F32), (13, 100, BF16), (1, 64, BF16)])
def test_ones_column_lays_the_output_out_for_a_biased_linear(N, C, dtype):
    """With ones_column the normalised output is the same, bit for bit, and so are the gradients; its rows
    lie in rows of gpt2_kernels.linear.padded_width(C) (128 bytes a line in bf16) that continue with a one and
    seven zeros, which the weight-gradient GEMM of a biased linear layer reads (gpt2_kernels/linear.py)."""
    g = torch.Generator().manual_seed(C)
    x, y, d_res, d_out = (torch.randn(N, C, generator=g).to(DEVICE, dtype) for _ in range(4))
    w = (1 + 0.5 * torch.randn(C, generator=g)).to(DEVICE)
    b = (0.1 * torch.randn(C, generator=g)).to(DEVICE)
    results = []
    for ones_column in (False, True):
        leaves = [t.clone().requires_grad_() for t in (x, y, w, b)]
        residual, out = add_layernorm(*leaves, out_dtype=dtype, ones_column=ones_column)
        torch.autograd.backward((residual, out), (d_res, d_out))
        results.append((residual, out, [t.grad for t in leaves]))
    (res0, out0, grads0), (res1, out1, grads1) = results
    assert torch.equal(res1, res0) and torch.equal(out1, out0)
    assert all(torch.equal(a, b) for a, b in zip(grads1, grads0))
    assert out1.stride() == ((padded_width(C), 1) if N > 1 else out1.stride())
    assert padded_width(C) % 64 == 0 and padded_width(C) >= C + ONES_COLUMNS
    tail = augmented(out1)[:, C:]  # (N, 8)
    assert torch.equal(tail[:, 0], torch.ones(N, dtype=dtype, device=DEVICE))
    assert torch.equal(tail[:, 1:], torch.zeros(N, ONES_COLUMNS - 1, dtype=dtype, device=DEVICE))


def test_mismatched_shapes_are_rejected():
    x, y = torch.randn(4, 24), torch.randn(4, 20)
    with pytest.raises(ValueError, match="y shape"):
        add_layernorm(x, y, torch.ones(24), torch.zeros(24))
    with pytest.raises(ValueError, match="weight and bias"):
        add_layernorm(x, None, torch.ones(20), torch.zeros(20))
    with pytest.raises(ValueError, match="bias_in_y"):
        add_layernorm(x, torch.randn(4, 24), torch.ones(24), torch.zeros(24), bias_in_y=torch.zeros(20))
    with pytest.raises(ValueError, match="bias_in_y"):
        add_layernorm(x, None, torch.ones(24), torch.zeros(24), bias_in_y=torch.zeros(24))


@pytest.mark.parametrize(
    "x_dtype, out_dtype, saves_the_residual",
    [
        (F32, BF16, False),  # fp32 stream, bf16 output: a bf16 copy, the fp32 residual is freed after the next add
        (F32, F32, True),  # same dtype: the residual output itself, no copy
        (BF16, BF16, True),  # the bf16 stream: the residual output itself, no copy
    ],
)
def test_backward_keeps_one_residual_in_the_output_dtype(x_dtype, out_dtype, saves_the_residual):
    """The memory and traffic claims: forward writes and backward keeps exactly one (N, C) tensor
    besides its outputs' own, in out's dtype, and none at all when the residual already has it."""
    N, C = 8, 24
    x = torch.randn(N, C, device=DEVICE, dtype=x_dtype, requires_grad=True)
    y = torch.randn(N, C, device=DEVICE, dtype=BF16, requires_grad=True)
    w, b, bias_in_y = (torch.randn(C, device=DEVICE, requires_grad=True) for _ in range(3))
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        residual, _ = add_layernorm(x, y, w, b, out_dtype=out_dtype, bias_in_y=bias_in_y)
    rows = [t for t in saved if t.shape == (N, C)]
    assert [t.dtype for t in rows] == [out_dtype]
    assert (rows[0].data_ptr() == residual.data_ptr()) == saves_the_residual
    op_outputs = torch.ops.gpt2_kernels.add_layernorm_fwd(x.detach(), y.detach(), bias_in_y, w, b, 1e-5, out_dtype,
                                                          False)
    assert sum(t.numel() == N * C for t in op_outputs) == (2 if saves_the_residual else 3)


@pytest.mark.parametrize("dtype", [F32, BF16])
def test_same_dtype_gradient_is_written_once_for_x_and_y(dtype):
    """x + y: when x and y share a dtype their gradients are one tensor (d(residual) is written once)."""
    g = torch.Generator().manual_seed(4)
    x, y = (torch.randn(8, 24, generator=g).to(DEVICE, dtype).requires_grad_() for _ in range(2))
    w, b, bias_in_y = (torch.randn(24, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    d_res, d_out = (torch.randn(8, 24, generator=g).to(DEVICE, dtype) for _ in range(2))
    residual, out = add_layernorm(x, y, w, b, out_dtype=dtype, bias_in_y=bias_in_y)
    dx, dy = torch.autograd.grad((residual, out), (x, y), (d_res, d_out))
    assert dx.data_ptr() == dy.data_ptr()


@pytest.mark.parametrize("y_dtype", [F32, BF16], ids=["dy-shared", "dy-own-dtype"])
@pytest.mark.parametrize("config", _BWD_CONFIGS, ids=lambda c: f"{c['BLOCK_R']}rows-{c['num_warps']}warps")
def test_every_swept_backward_launch_shape_matches_reference(config, y_dtype):
    """Each shape the sweep times must be right, not only the one `bwd_launch_shape` picks for C: 37 rows over programs of several rows each (a partial last block of
    BLOCK_R rows, a last program past the end) and C = 100 inside a 128-wide block; with the y bias's
    gradient (the third partial sum), and d(residual) written once or also in y's own dtype."""
    N, C = 37, 100
    g = torch.Generator().manual_seed(config["BLOCK_R"] * 10 + config["num_warps"])
    z = torch.randn(N, C, generator=g, dtype=torch.float64)
    w = 1 + 0.5 * torch.randn(C, generator=g, dtype=torch.float64)
    b = 0.1 * torch.randn(C, generator=g, dtype=torch.float64)
    d_out, d_res = torch.randn(N, C, generator=g), torch.randn(N, C, generator=g)
    var, mean = torch.var_mean(z, dim=1, unbiased=False)
    rstd = torch.rsqrt(var + 1e-5)

    dx, dy, dparams = add_layernorm_backward(
        z.float().to(DEVICE), w.float().to(DEVICE), mean.float().to(DEVICE), rstd.float().to(DEVICE),
        d_out.to(DEVICE), d_res.to(DEVICE), F32, y_dtype, has_bias_in_y=True, config=config)
    dx, dy, dparams = dx.cpu(), dy.cpu(), dparams.cpu()

    rz, rw, rb = (t.clone().requires_grad_() for t in (z, w, b))
    _, ref_out = add_layernorm_reference(rz, None, rw, rb)
    ref_out.backward(d_out.double())
    ref_dz = rz.grad + d_res.double()
    assert rel_err(dx, ref_dz) < 1e-5
    if y_dtype == F32:
        assert dy.numel() == 0, "x's gradient serves y too"
    else:
        # the same sum, rounded once to bf16 (truncated, on Triton's interpreter)
        assert torch.all((dy.float() - dx).abs() <= 2**-7 * dx.abs()), "dy is dx in y's dtype"
    assert dparams.shape == (3, C)
    assert rel_err(dparams[0], rw.grad) < 1e-5 and rel_err(dparams[1], rb.grad) < 1e-5
    assert rel_err(dparams[2], ref_dz.sum(0)) < 1e-5
