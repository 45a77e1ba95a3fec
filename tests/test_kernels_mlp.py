"""The fused path's MLP op (gpt2_kernels/mlp.py) against the plain MLP under autograd, at odd shapes.

On CPU the op runs its reference (GELU's derivative written out), checked against autograd through
`F.gelu` and `F.linear`; on a GPU with quack-kernels installed, the GELU-epilogue GEMMs are checked
against the fp32 reference.
"""

import pytest
import torch
import torch.nn.functional as F

from gpt2.train_config import TrainConfig
import gpt2_kernels.mlp as mlp_op
from gpt2_kernels.linear import with_ones_column
from tests.fixtures.numerics import rel_err


OPCHECKS = ("test_schema", "test_faketensor", "test_autograd_registration")


def weights(C, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(*s, dtype=dtype, device=device, generator=g) * 0.3
            for s in ((4 * C, C), (4 * C,), (C, 4 * C), (C,))]


def plain_mlp(h, w_fc, b_fc, w_proj, b_proj):
    return F.linear(F.gelu(F.linear(h, w_fc, b_fc), approximate="tanh"), w_proj, b_proj)


@pytest.mark.parametrize("with_proj_bias", [True, False])
@pytest.mark.parametrize("N, C", [(7, 5), (1, 3), (33, 12)])
def test_reference_backward_matches_autograd(N, C, with_proj_bias):
    w_fc, b_fc, w_proj, b_proj = weights(C)
    b_proj = b_proj if with_proj_bias else None
    g = torch.Generator().manual_seed(1)
    h, dy = (torch.randn(N, C, dtype=torch.float64, generator=g) for _ in range(2))
    h = with_ones_column(h)  # as add_layernorm lays it out for the op: c_fc's bias gradient comes from it
    y, pre, post = mlp_op.mlp_reference_fwd(h, w_fc, b_fc, w_proj, b_proj)
    grads = mlp_op.mlp_reference_bwd(dy, h, pre, pre.new_empty(0), w_fc, w_proj)
    kept = mlp_op.mlp_reference_bwd(dy, h, pre, post, w_fc, w_proj)  # post from the forward
    assert all(rel_err(a, b) < 1e-12 for a, b in zip(grads, kept))
    leaves = [t.clone().requires_grad_() for t in (h, w_fc, b_fc, w_proj)]
    y_ref = plain_mlp(*leaves, b_proj)
    y_ref.backward(dy)
    assert rel_err(y, y_ref) < 1e-12
    for a, b in zip(grads, [t.grad for t in leaves]):  # c_proj's bias gradient is add_layernorm's (bias_in_y)
        assert rel_err(a, b) < 1e-12


@pytest.mark.parametrize("keep_post", [False, True])
def test_op_autograd_on_cpu_matches_plain_mlp(keep_post):
    """gpt2_kernels.mlp with its registered backward, as the fused model calls it (fp32 params, bf16 compute),
    with post rebuilt in backward or kept from the forward."""
    C = 6
    params = [t.float().requires_grad_() for t in weights(C)]
    ref_params = [t.detach().double().requires_grad_() for t in params]
    g = torch.Generator().manual_seed(2)
    h = torch.randn(2, 5, C, generator=g)
    dy = torch.randn(2, 5, C, generator=g)
    x = with_ones_column(h).requires_grad_()
    y = mlp_op.fused_mlp(x, *params, torch.float32, keep_post=keep_post)
    y.backward(dy)
    x_ref = h.double().requires_grad_()
    y_ref = plain_mlp(x_ref, *ref_params)
    y_ref.backward(dy.double())
    assert y.shape == h.shape and y.dtype == torch.float32 and rel_err(y, y_ref) < 1e-5
    assert rel_err(x.grad, x_ref.grad) < 1e-5
    for p, r in zip(params[:3], ref_params):
        assert p.grad.dtype == torch.float32 and rel_err(p.grad, r.grad) < 1e-5
    assert params[3].grad is None  # c_proj's bias: a constant here, its gradient add_layernorm's (bias_in_y)


def test_the_backward_uses_the_weights_the_forward_cast():
    """fused_mlp's backward multiplies by the forward's bf16 casts of W_fc and W_proj (no second cast a
    micro-step): weights changed in place after the forward leave the input gradient as it was, and autograd
    no longer refuses the backward as it did while the op kept the parameters themselves."""
    C = 8
    w_fc, b_fc, w_proj, _ = (t.float() for t in weights(C))
    g = torch.Generator().manual_seed(2)
    h, dy = (torch.randn(16, C, generator=g) for _ in range(2))
    x = with_ones_column(h, torch.bfloat16).requires_grad_()
    params = [t.clone().requires_grad_() for t in (w_fc, b_fc, w_proj)]
    y = mlp_op.fused_mlp(x, *params[:2], params[2], None, torch.bfloat16)
    with torch.no_grad():
        params[0].mul_(2), params[2].mul_(-1)
    y.backward(dy.bfloat16())
    ref = h.bfloat16().double().requires_grad_()
    plain_mlp(ref, w_fc.bfloat16().double(), b_fc.bfloat16().double(), w_proj.bfloat16().double(), None
              ).backward(dy.bfloat16().double())
    assert rel_err(x.grad, ref.grad) < 2e-2


@pytest.mark.parametrize("keep_post", [False, True])
def test_weights_cast_by_the_caller_are_what_both_passes_multiply_with(keep_post):
    """With cast_weights (W_fc and W_proj already in the compute dtype, gpt2.step.CastWeights) the op casts
    nothing: the same output and gradients, bit for bit, as with its own casts, and casts that differ from the
    parameters' give that MLP's output and input gradient, while the weights' gradients reach the parameters."""
    C = 8
    w_fc, b_fc, w_proj, b_proj = (t.float() for t in weights(C))
    g = torch.Generator().manual_seed(6)
    h, dy = torch.randn(13, C, generator=g), torch.randn(13, C, generator=g).bfloat16()

    def run(casts):
        x = with_ones_column(h, torch.bfloat16).requires_grad_()
        params = [t.clone().requires_grad_() for t in (w_fc, b_fc, w_proj)]
        y = mlp_op.fused_mlp(x, *params, b_proj, torch.bfloat16, keep_post, casts)
        y.backward(dy)
        return y, x.grad, *(p.grad for p in params)

    own, given = run((None, None)), run((w_fc.bfloat16(), w_proj.bfloat16()))
    for a, b in zip(own, given):
        assert torch.equal(a, b)
    y, dx, dw_fc, _, dw_proj = run((2 * w_fc.bfloat16(), -w_proj.bfloat16()))
    ref = h.bfloat16().double().requires_grad_()
    y_ref = plain_mlp(ref, 2 * w_fc.bfloat16().double(), b_fc.bfloat16().double(), -w_proj.bfloat16().double(),
                      b_proj.bfloat16().double())
    y_ref.backward(dy.double())
    assert rel_err(y, y_ref) < 2e-2 and rel_err(dx, ref.grad) < 2e-2
    assert dw_fc.dtype == dw_proj.dtype == torch.float32


def test_casts_of_another_shape_or_dtype_are_refused_naming_the_one_expected():
    """A caller's casts swapped (W_proj's for W_fc's) or in fp32 are refused with the shape and dtype expected."""
    C = 8
    w_fc, b_fc, w_proj, b_proj = (t.float() for t in weights(C))
    x = with_ones_column(torch.randn(13, C), torch.bfloat16)
    for casts, expected in (((w_proj.bfloat16(), w_fc.bfloat16()), r"\(32, 8\)"), ((w_fc, w_proj), r"\(32, 8\)"),
                            ((w_fc.bfloat16(), w_proj), r"\(8, 32\)")):
        with pytest.raises(ValueError, match=rf"is not this weight's cast: expected {expected} in torch.bfloat16"):
            mlp_op.fused_mlp(x, w_fc, b_fc, w_proj, b_proj, torch.bfloat16, False, casts)


@pytest.mark.parametrize("keep_post", [False, True])
def test_c_proj_weight_gradient_is_added_into_a_given_buffer(keep_post):
    """With proj_weight_grad (a view of the gradient buffer, gpt2.step.FlatGradients'), dW_proj's GEMM adds into it
    and autograd gets none for W_proj; the output and every other gradient are the same bits as without."""
    C, N = 6, 11
    w_fc, b_fc, w_proj, b_proj = weights(C, seed=8)
    g = torch.Generator().manual_seed(9)
    h, dy = torch.randn(N, C, dtype=torch.float64, generator=g), torch.randn(N, C, dtype=torch.float64, generator=g)

    def run(into):
        x = with_ones_column(h).requires_grad_()
        params = [t.clone().requires_grad_() for t in (w_fc, b_fc, w_proj)]
        y = mlp_op.fused_mlp(x, *params, b_proj, torch.float64, keep_post, proj_weight_grad=into)
        y.backward(dy)
        return y, x.grad, *(p.grad for p in params)

    flat = torch.randn(C * 4 * C + 5, dtype=torch.float64)  # what earlier micro-steps added, then a tail
    before = flat.clone()
    into = flat[:C * 4 * C].view(C, 4 * C)
    *own, dw_proj = run(None)
    *given, none = run(into)
    assert none is None and all(torch.equal(a, b) for a, b in zip(own, given))
    assert rel_err(into, before[:-5].view(C, 4 * C) + dw_proj) < 1e-12 and torch.equal(flat[-5:], before[-5:])
    h1 = with_ones_column(h)
    _, pre, post, w_fc_c, w_proj_c = mlp_op._mlp_fwd(h1, w_fc, b_fc, w_proj, None, torch.float64, keep_post, None, None,
                                                     None)
    torch.library.opcheck(mlp_op._mlp_bwd, (dy, h1, pre, post, w_fc_c, w_proj_c, torch.float64, into.clone()),
                          test_utils=OPCHECKS)


def test_ops_pass_opcheck():
    """Fake (meta) implementations agree with the real ones: what torch.compile traces is what runs.
    (opcheck's AOT tests are left out: they clone h, which drops the ones column past its last column.)"""
    C = 4
    w_fc, b_fc, w_proj, b_proj = (t.float() for t in weights(C))
    h = with_ones_column(torch.randn(9, C))
    for keep_post in (False, True):
        for casts in ((None, None), (w_fc.clone(), w_proj.clone())):  # cast in the op, or by the caller
            args = (h, w_fc, b_fc, w_proj, b_proj, torch.float32, keep_post, *casts, None)
            torch.library.opcheck(mlp_op._mlp_fwd, args, test_utils=OPCHECKS)
        _, pre, post, w_fc_c, w_proj_c = mlp_op._mlp_fwd(h, w_fc, b_fc, w_proj, None, torch.float32, keep_post,
                                                         None, None, None)
        assert post.shape == ((9, 4 * C) if keep_post else (0,))
        torch.library.opcheck(mlp_op._mlp_bwd, (torch.randn(9, C), h, pre, post, w_fc_c, w_proj_c, torch.float32,
                                                None), test_utils=OPCHECKS)


@pytest.mark.gpu
@pytest.mark.parametrize("C", [768, 1600])
def test_gelu_epilogue_on_gpu(C):
    """quack's gemm_act and dgelu (their pinned configs; where installed) against the fp32 reference, at d12's
    and d48's widths (each its own gemm_act tile); the c_fc bias gradient from the ones column included."""
    name = mlp_op.configure_mlp(torch.bfloat16, "cuda")
    try:
        if name != "quack-gelu-epilogue":
            pytest.skip(f"quack-kernels not installed or not applicable here ({name})")
        w_fc, b_fc, w_proj, b_proj = (t.float() * 0.1 for t in weights(C, device="cuda"))
        g = torch.Generator(device="cuda").manual_seed(3)
        h = with_ones_column(torch.randn(1000, C, device="cuda", generator=g).bfloat16())  # rows not a multiple of a tile
        dy = torch.randn(1000, C, device="cuda", generator=g).bfloat16()
        ref_y, ref_pre, ref_post = mlp_op.mlp_reference_fwd(h.float(), w_fc, b_fc, w_proj, b_proj)
        ref_grads = mlp_op.mlp_reference_bwd(dy.float(), with_ones_column(h, torch.float32), ref_pre, ref_post,
                                             w_fc, w_proj)
        for keep_post in (False, True):  # dgelu rebuilding post, and its variant without postact
            y, pre, post, w_fc_c, w_proj_c = mlp_op._mlp_fwd(h, w_fc, b_fc, w_proj, b_proj, torch.bfloat16,
                                                             keep_post, None, None, None)
            grads = mlp_op._mlp_bwd(dy, h, pre, post, w_fc_c, w_proj_c, torch.float32, None)
            assert rel_err(y, ref_y) < 1e-2 and rel_err(pre, ref_pre) < 1e-2
            assert post.numel() == 0 or rel_err(post, ref_post) < 1e-2
            for a, b in zip(grads, ref_grads):
                assert rel_err(a, b) < 1e-2
    finally:
        mlp_op._gelu_epilogue_on_cuda = False


def test_without_quack_the_fused_model_keeps_the_plain_mlp():
    """Where quack-kernels is not installed (this CPU machine), configuring asks nothing of a GPU and
    leaves the GELU to Inductor on CUDA; the CPU path keeps testing the op's reference."""
    try:
        import quack  # noqa: F401
        pytest.skip("quack-kernels is installed here")
    except ImportError:
        pass
    assert mlp_op.configure_mlp(torch.bfloat16, "cpu") == "inductor-gelu"
    assert not mlp_op.gelu_epilogue_enabled(torch.device("cuda"))
    assert mlp_op.gelu_epilogue_enabled(torch.device("cpu"))


def test_weight_gradients_are_not_rounded_to_the_activation_dtype():
    """docs/kernels.md: the weight gradients come out in the parameters' fp32, the bf16 product never rounded
    first (on CPU the same values multiplied in fp32, as the CUDA matmul's fp32 output gives them)."""
    C = 16
    w_fc, _, w_proj, _ = (t.float() for t in weights(C))
    g = torch.Generator().manual_seed(5)
    h, dy = (torch.randn(64, C, generator=g).bfloat16() for _ in range(2))
    h = with_ones_column(h)
    pre = F.linear(h, w_fc.bfloat16())
    _, dw_fc, _, dw_proj = mlp_op.mlp_reference_bwd(dy, h, pre, pre.new_empty(0), w_fc, w_proj)
    assert dw_fc.dtype == dw_proj.dtype == torch.float32
    for dw in (dw_fc, dw_proj):
        assert not torch.equal(dw, dw.bfloat16().float())  # values finer than bf16 holds


def test_layers_keeping_post_stay_within_the_configured_budget(monkeypatch):
    """None without a budget. gpt2.train's default (2.5 GB) at d12's 65,536 rows a micro-step (0.40 GB of post
    a layer): 6 of 12, as the docs say; 3.3 GB: 8; a short run's rows fit every layer; a model whose one layer
    is over the budget keeps none."""
    for name in ("_kept_post_bytes", "_gelu_epilogue_on_cuda"):  # restored after the test
        monkeypatch.setattr(mlp_op, name, getattr(mlp_op, name))
    mlp_op.configure_mlp(torch.bfloat16, "cpu", gelu_epilogue=False)
    assert mlp_op.layers_keeping_post(12, 1024, 3072, torch.bfloat16) == 0
    mlp_op.configure_mlp(torch.bfloat16, "cpu", gelu_epilogue=False, keep_post_bytes=TrainConfig.keep_mlp_post_gb * 1e9)
    assert mlp_op.layers_keeping_post(12, 65536, 3072, torch.bfloat16) == 6
    mlp_op.configure_mlp(torch.bfloat16, "cpu", gelu_epilogue=False, keep_post_bytes=3.3e9)
    assert mlp_op.layers_keeping_post(12, 65536, 3072, torch.bfloat16) == 8
    assert mlp_op.layers_keeping_post(12, 1024, 3072, torch.bfloat16) == 12
    assert mlp_op.layers_keeping_post(48, 10 ** 6, 6400, torch.float32) == 0


@pytest.mark.parametrize("keep_post", [False, True])
def test_backward_reads_the_kept_post(keep_post):
    """With keep_post the forward's GELU output is held for backward, (N, 4C) more memory, and dW_proj
    = dyᵀ post comes from it: doubling what was saved doubles dW_proj and nothing else. Without, nothing
    of that size is held and the backward rebuilds post from pre."""
    C, N = 6, 10
    params = [t.float().requires_grad_() for t in weights(C)[:3]]
    b_proj = weights(C)[3].float()
    g = torch.Generator().manual_seed(4)
    h, dy = (torch.randn(N, C, generator=g) for _ in range(2))
    h = with_ones_column(h)

    def grads(double_post: bool) -> tuple[list[torch.Tensor], list[torch.Size]]:
        saved = []

        def unpack(i):  # saved in order h, pre, post, w_fc, w_proj
            return saved[i] * 2 if double_post and i == 2 else saved[i]

        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or len(saved) - 1, unpack):
            y = mlp_op.fused_mlp(h, *params, b_proj, torch.float32, keep_post=keep_post)
        y.backward(dy)
        out = [p.grad.clone() for p in params]
        for p in params:
            p.grad = None
        return out, [t.shape for t in saved]

    (dw_fc, db_fc, dw_proj), shapes = grads(double_post=False)
    (dw_fc2, db_fc2, dw_proj2), _ = grads(double_post=True)
    assert shapes[2] == ((N, 4 * C) if keep_post else (0,))
    assert torch.equal(dw_fc2, dw_fc) and torch.equal(db_fc2, db_fc)
    assert torch.allclose(dw_proj2, 2 * dw_proj if keep_post else dw_proj)
