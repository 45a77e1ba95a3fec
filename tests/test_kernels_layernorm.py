"""kernels.layernorm: fused residual add + LayerNorm vs autograd through the plain formula in float64.

Tolerances (relative L2 error): fp32 everywhere 1e-5; a bf16 branch input / bf16 normalised output
2e-2 (the output and the branch gradient are rounded to bf16, 2^-9 relative, and the reference sees
the same bf16-rounded inputs and incoming gradients, so only the kernel's own rounding is measured).
"""

import pytest
import torch

from kernels.layernorm import _BWD_CONFIGS, add_layernorm, add_layernorm_backward, add_layernorm_reference
from tests.fixtures.numerics import rel_err

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize(
    "N, C, y_dtype, out_dtype, tol",
    [
        # rows and C not powers of two; 37 rows > 16 backward programs on CPU, so programs walk
        # several rows and the last one runs past the end (masked)
        (37, 24, torch.float32, torch.float32, 1e-5),
        (13, 100, torch.bfloat16, torch.bfloat16, 2e-2),  # the training layout: fp32 residual, bf16 branch
        (5, 24, None, torch.float32, 1e-5),  # plain LayerNorm (first block's ln_1)
    ],
)
def test_matches_reference(N, C, y_dtype, out_dtype, tol):
    g = torch.Generator().manual_seed(N * C)
    x = torch.randn(N, C, generator=g).to(DEVICE).requires_grad_()
    y = torch.randn(N, C, generator=g).to(DEVICE, y_dtype).requires_grad_() if y_dtype else None
    w = (1 + 0.5 * torch.randn(C, generator=g)).to(DEVICE).requires_grad_()
    b = (0.1 * torch.randn(C, generator=g)).to(DEVICE).requires_grad_()
    # incoming gradients, rounded to the dtypes autograd will hand the op
    d_res = torch.randn(N, C, generator=g).to(DEVICE)
    d_out = torch.randn(N, C, generator=g).to(DEVICE, out_dtype)

    residual, out = add_layernorm(x, y, w, b, out_dtype=out_dtype)
    assert residual.dtype == x.dtype and out.dtype == out_dtype
    torch.autograd.backward((residual, out), (d_res, d_out))

    inputs = [x, w, b] + ([y] if y is not None else [])
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    rx, rw, rb = ref_inputs[:3]
    ry = ref_inputs[3] if y is not None else None
    ref_res, ref_out = add_layernorm_reference(rx, ry, rw, rb)
    torch.autograd.backward((ref_res, ref_out), (d_res.double(), d_out.double()))

    assert rel_err(residual, ref_res) < 1e-6
    assert rel_err(out, ref_out) < tol
    for name, t, r in zip(("x", "weight", "bias", "y"), inputs, ref_inputs):
        assert t.grad.dtype == t.dtype, name
        assert rel_err(t.grad, r.grad) < tol, name


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


def test_opcheck_fake_and_autograd_registrations():
    g = torch.Generator().manual_seed(2)
    x, y = (torch.randn(4, 24, generator=g).to(DEVICE).requires_grad_() for _ in range(2))
    w, b = (torch.randn(24, generator=g).to(DEVICE).requires_grad_() for _ in range(2))
    op = torch.ops.gpt2_kernels.add_layernorm_fwd.default
    torch.library.opcheck(op, (x, y, w, b, 1e-5, torch.float32),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_mismatched_shapes_are_rejected():
    x, y = torch.randn(4, 24), torch.randn(4, 20)
    with pytest.raises(ValueError, match="y shape"):
        add_layernorm(x, y, torch.ones(24), torch.zeros(24))
    with pytest.raises(ValueError, match="weight and bias"):
        add_layernorm(x, None, torch.ones(20), torch.zeros(20))


@pytest.mark.parametrize("out_dtype, saved_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)])
def test_backward_saves_the_residual_in_the_output_dtype(out_dtype, saved_dtype):
    """The memory claim: with a bf16 output, the only (N, C) tensor kept for backward is bf16 (the
    fp32 residual can be freed after the next add); with an fp32 output the residual itself."""
    x = torch.randn(8, 24, device=DEVICE, requires_grad=True)
    y = torch.randn(8, 24, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    w, b = torch.ones(24, device=DEVICE, requires_grad=True), torch.zeros(24, device=DEVICE, requires_grad=True)
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        add_layernorm(x, y, w, b, out_dtype=out_dtype)
    assert [dtype for shape, dtype in saved if shape == (8, 24)] == [saved_dtype]


@pytest.mark.parametrize("config", _BWD_CONFIGS, ids=lambda c: f"{c['BLOCK_R']}rows-{c['num_warps']}warps")
def test_every_tuned_backward_launch_shape_matches_reference(config):
    """The autotuner may pick any of these on a GPU, so each must be right, not only the one the
    interpreter runs by default: 37 rows over programs of several rows each (a partial last block of
    BLOCK_R rows, a last program past the end) and C = 100 inside a 128-wide block."""
    N, C = 37, 100
    g = torch.Generator().manual_seed(config["BLOCK_R"] * 10 + config["num_warps"])
    z = torch.randn(N, C, generator=g, dtype=torch.float64)
    w = 1 + 0.5 * torch.randn(C, generator=g, dtype=torch.float64)
    b = 0.1 * torch.randn(C, generator=g, dtype=torch.float64)
    d_out, d_res = torch.randn(N, C, generator=g), torch.randn(N, C, generator=g)
    var, mean = torch.var_mean(z, dim=1, unbiased=False)
    rstd = torch.rsqrt(var + 1e-5)

    dx, dy, dwb = add_layernorm_backward(
        z.float().to(DEVICE), w.float().to(DEVICE), mean.float().to(DEVICE), rstd.float().to(DEVICE),
        d_out.to(DEVICE), d_res.to(DEVICE), torch.float32, torch.float32, config=config)
    dx, dy, dwb = dx.cpu(), dy.cpu(), dwb.cpu()

    rz, rw, rb = (t.clone().requires_grad_() for t in (z, w, b))
    _, ref_out = add_layernorm_reference(rz, None, rw, rb)
    ref_out.backward(d_out.double())
    assert rel_err(dx, rz.grad + d_res.double()) < 1e-5
    assert torch.equal(dx, dy), "dx and dy are the same sum"
    assert rel_err(dwb[0], rw.grad) < 1e-5 and rel_err(dwb[1], rb.grad) < 1e-5
